"""Random-weight decoder checkpoints for the bundled demo models.

Both demo models (the Qwen3-shaped text demo and the Llama-shaped LLM of the
text-to-speech demo) draw their weights here, in HF's tensor names, from one
seeded generator in a fixed order, so a build is byte-identical every time.
Projections are scaled by gain / sqrt(fan_in) so activations stay in range
through the layers; norms are near 1. The order of draws is part of the
output: changing it changes every demo weight (and the golden traces).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class DecoderShape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    qk_norm: bool = False  # Qwen3's per-head q/k RMSNorm


def random_decoder_weights(shape: DecoderShape, g: torch.Generator, gain: float) -> dict[str, torch.Tensor]:
    """Embedding, layers and final norm (no lm_head), drawn from g in a fixed order."""

    def proj(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=g) * (gain / in_features**0.5)

    def norm(size: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(size, generator=g)

    s = shape
    weights = {"model.embed_tokens.weight": torch.randn(s.vocab, s.hidden, generator=g)}
    for i in range(s.layers):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": norm(s.hidden),
            p + "self_attn.q_proj.weight": proj(s.heads * s.head_dim, s.hidden),
            p + "self_attn.k_proj.weight": proj(s.kv_heads * s.head_dim, s.hidden),
            p + "self_attn.v_proj.weight": proj(s.kv_heads * s.head_dim, s.hidden),
            p + "self_attn.o_proj.weight": proj(s.hidden, s.heads * s.head_dim),
        }
        if s.qk_norm:
            weights[p + "self_attn.q_norm.weight"] = norm(s.head_dim)
            weights[p + "self_attn.k_norm.weight"] = norm(s.head_dim)
        weights |= {
            p + "post_attention_layernorm.weight": norm(s.hidden),
            p + "mlp.gate_proj.weight": proj(s.intermediate, s.hidden),
            p + "mlp.up_proj.weight": proj(s.intermediate, s.hidden),
            p + "mlp.down_proj.weight": proj(s.hidden, s.intermediate),
        }
    weights["model.norm.weight"] = norm(s.hidden)
    return weights


def write_if_changed(path: Path, data: bytes) -> None:
    """Writes atomically, and not at all when the file already holds these bytes (setup stays quiet)."""
    if path.exists() and path.read_bytes() == data:
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def build_cli(prog: str, description: str, build: Callable[[Path], Path], argv: list[str] | None = None) -> int:
    """A demo model builder's command line: --out DIR, then one JSON line naming the directory (setup reads it)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    build(args.out)
    print(json.dumps({"model_dir": str(args.out)}))
    return 0


# Gain 3 per layer (std 3/sqrt(fan_in)): layers transform the residual stream
# strongly, so logits depend on the whole context.
PROJECTION_GAIN = 3.0


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Re-draws every weight of a transformers decoder in place so that greedy
    decoding produces varied tokens (the random-weight test and demo directories
    built with transformers' own classes): norms near 1, embeddings and heads
    standard normal, biases small, projections PROJECTION_GAIN / sqrt(fan_in)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + torch.randn(param.shape, generator=generator) * 0.1)
            elif "embed_tokens" in name or name == "lm_head.weight":
                param.copy_(torch.randn(param.shape, generator=generator))
            elif name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
            else:
                # The last dimension is the input's, for stacked experts [experts, out, in] too.
                param.copy_(torch.randn(param.shape, generator=generator) * PROJECTION_GAIN / param.shape[-1] ** 0.5)
