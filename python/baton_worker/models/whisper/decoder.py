"""Whisper's text decoder (transformers' WhisperDecoder + proj_out) for the
engine's paged step machinery: the same interface the StepRunner uses on
model/decoder.py's DecoderModel, over a flat batch of every row's new tokens.

Per layer, pre-LayerNorm (eps 1e-5) throughout:
  1. causal self-attention; its K/V go to the paged KV cache through the
     step's attention object (attention.run), as the LLM decoder's do;
  2. cross-attention to the request's encoder output, whose K/V were written
     once per request into its cross blocks of the same cache (cross_kv /
     write_cross; attention.cross reads them, attention/cross.py);
  3. fc1 -> activation -> fc2;
each added to the residual stream. Then a final LayerNorm and the vocabulary
projection, tied to embed_tokens. Positions are learned (embed_positions),
no rotary.

Queries are multiplied by head_dim ** -0.5 right after their projection, as
transformers and openai/whisper do, so the attention calls run with scale 1.0
(self.scale, which the backend is built with): the order of rounding is part
of matching them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from ...attention.cross import CrossAttention, CrossStepAttention
from ...model.config import ModelConfig, RopeConfig
from ...model.decoder import LMHead
from ...model.layer_ops import TorchOps
from ..llava.vision import activation
from .encoder import LAYER_NORM_EPS

if TYPE_CHECKING:
    from ...lora import LoraBatch

ARCHITECTURE = "WhisperForConditionalGeneration"
DECODER_PREFIX = "model.decoder."


def whisper_model_config(config: dict[str, Any]) -> ModelConfig:
    """The decoder's shape as a ModelConfig (config.json's dict): what sizes the KV cache, whose
    self-attention and cross-attention blocks both have the decoder's layers, heads and head_dim."""
    layers = int(config["decoder_layers"])
    heads = int(config["decoder_attention_heads"])
    d_model = int(config["d_model"])
    if d_model % heads:
        raise ValueError(f"d_model {d_model} is not a multiple of decoder_attention_heads {heads}")
    eos = config.get("eos_token_id")
    return ModelConfig(
        architecture=ARCHITECTURE,
        vocab_size=int(config["vocab_size"]),
        hidden_size=d_model,
        intermediate_size=int(config["decoder_ffn_dim"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=d_model // heads,
        rms_norm_eps=LAYER_NORM_EPS,  # LayerNorm's eps here; Whisper has no RMSNorm
        max_position_embeddings=int(config["max_target_positions"]),
        tie_word_embeddings=True,
        qkv_bias=True,  # q and v (k has none)
        o_bias=True,
        mlp_bias=True,
        qk_norm=False,
        rope=RopeConfig(),  # unused: positions are learned
        sliding_windows=[None] * layers,
        torch_dtype=config.get("dtype") or config.get("torch_dtype"),
        eos_token_ids=[] if eos is None else [int(e) for e in eos] if isinstance(eos, list) else [int(eos)],
    )


Pair = tuple[torch.Tensor, torch.Tensor | None]  # (weight, bias)


@dataclass
class WhisperLayer:
    self_norm: Pair
    qkv: Pair  # q, k, v projections as one matrix (k's bias zeros: it has none)
    self_out: Pair
    cross_norm: Pair
    cross_q: Pair
    cross_kv: Pair  # encoder_attn k and v as one matrix (k's bias zeros)
    cross_out: Pair
    final_norm: Pair
    fc1: Pair
    fc2: Pair


def _fuse(parts: list[Pair]) -> Pair:
    """Projections of the same input as one matrix multiply; a missing bias becomes zeros (adding 0.0 is exact)."""
    weight = torch.cat([w for w, _ in parts])
    bias = torch.cat([b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) for w, b in parts])
    return weight, bias


class WhisperDecoder:
    """`get(name)` returns a checkpoint tensor on `device` and `dtype` (WeightReader.get); `config` is config.json's dict."""

    def __init__(self, get: Callable[[str], torch.Tensor], config: dict[str, Any], device: torch.device, dtype: torch.dtype,
                 prefix: str = DECODER_PREFIX):
        self.config = whisper_model_config(config)
        self.full_config = self.config
        self.tp = None
        self.device = torch.device(device)
        self.dtype = dtype
        c = self.config
        self.heads = c.num_heads
        self.head_dim = c.head_dim
        self.d_model = c.hidden_size
        self.scaling = self.head_dim**-0.5
        self.scale = 1.0  # for the attention backend: q is scaled before the product
        self.act = activation(config.get("activation_function", "gelu"))
        p = prefix

        def pair(name: str, bias: bool = True) -> Pair:
            return get(p + name + ".weight"), get(p + name + ".bias") if bias else None

        self.embed = get(p + "embed_tokens.weight")
        self.embed_positions = get(p + "embed_positions.weight")
        self.layers: list[WhisperLayer] = []
        for i in range(c.num_layers):
            q = f"layers.{i}."
            self.layers.append(WhisperLayer(
                self_norm=pair(q + "self_attn_layer_norm"),
                qkv=_fuse([pair(q + "self_attn.q_proj"), pair(q + "self_attn.k_proj", bias=False), pair(q + "self_attn.v_proj")]),
                self_out=pair(q + "self_attn.out_proj"),
                cross_norm=pair(q + "encoder_attn_layer_norm"),
                cross_q=pair(q + "encoder_attn.q_proj"),
                cross_kv=_fuse([pair(q + "encoder_attn.k_proj", bias=False), pair(q + "encoder_attn.v_proj")]),
                cross_out=pair(q + "encoder_attn.out_proj"),
                final_norm=pair(q + "final_layer_norm"),
                fc1=pair(q + "fc1"),
                fc2=pair(q + "fc2"),
            ))
        self.norm = pair("layer_norm")
        # proj_out is tied to embed_tokens. No low-precision screen: every token is decided in full precision.
        self.lm_head = LMHead(self.embed, screen=False)
        self.ops = TorchOps(c.rms_norm_eps)

    def weight_bytes(self) -> int:
        tensors: list[torch.Tensor] = [self.embed, self.embed_positions, *(t for t in self.norm if t is not None)]
        for layer in self.layers:
            for weight, bias in vars(layer).values():
                tensors += [weight] + ([bias] if bias is not None else [])
        tensors += [t for t in self.lm_head.tensors() if t is not self.embed]
        return sum(t.numel() * t.element_size() for t in tensors)


    @torch.inference_mode()
    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: CrossStepAttention,
        replace: tuple[torch.Tensor, torch.Tensor] | None = None,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T] for every row's new tokens -> the residual stream [T, d_model] after the
        last layer (before the final LayerNorm). attention: the step's self-attention with its cross plan
        (attention/cross.py with_cross)."""
        if replace is not None or lora is not None:
            raise ValueError("Whisper's decoder takes neither embedding replacements nor LoRA adapters")
        x = F.embedding(input_ids, self.embed) + F.embedding(positions, self.embed_positions)
        t, d = x.shape
        heads, hd = self.heads, self.head_dim
        for i, w in enumerate(self.layers):
            h = F.layer_norm(x, (d,), *w.self_norm, LAYER_NORM_EPS)
            q, k, v = F.linear(h, *w.qkv).split(d, dim=-1)
            q = (q * self.scaling).view(t, heads, hd)
            out = attention.run(i, q, k.view(t, heads, hd), v.view(t, heads, hd))
            x = x + F.linear(out.reshape(t, d), *w.self_out)
            h = F.layer_norm(x, (d,), *w.cross_norm, LAYER_NORM_EPS)
            q = (F.linear(h, *w.cross_q) * self.scaling).view(t, heads, hd)
            x = x + F.linear(attention.cross(i, q).reshape(t, d), *w.cross_out)
            h = F.layer_norm(x, (d,), *w.final_norm, LAYER_NORM_EPS)
            x = x + F.linear(self.act(F.linear(h, *w.fc1)), *w.fc2)
        return x

    def head_input(self, hidden: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The rows at `indices` through the final LayerNorm: what the vocabulary projection multiplies."""
        return F.layer_norm(hidden.index_select(0, indices), hidden.shape[-1:], *self.norm, LAYER_NORM_EPS)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """float32 logits [len(indices), vocab] of the hidden_states rows at `indices`."""
        return self.lm_head(self.head_input(hidden, indices))

    @torch.inference_mode()
    def cross_kv(self, layer: int, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder output rows [N, d_model] (one or more requests', concatenated) -> this layer's
        cross-attention k, v, each [N, heads, head_dim]."""
        n = states.shape[0]
        k, v = F.linear(states.to(self.dtype), *self.layers[layer].cross_kv).split(self.d_model, dim=-1)
        return k.view(n, self.heads, self.head_dim), v.view(n, self.heads, self.head_dim)

    @torch.inference_mode()
    def write_cross(self, cross: CrossAttention, states: list[torch.Tensor], slots: list[np.ndarray | torch.Tensor]) -> None:
        """Writes the cross K/V of every layer for requests whose encoder outputs are `states` ([n_i, d_model]
        each) into their cross slots (`slots[i]`: [n_i], CrossAttention.slots): one projection and one cache
        write per layer for all of them."""
        if len(states) != len(slots):
            raise ValueError(f"{len(states)} encoder outputs but {len(slots)} slot lists")
        if not states:
            return
        rows = torch.cat([s.to(self.device, self.dtype) for s in states])
        flat = torch.cat([torch.as_tensor(s, dtype=torch.int64).reshape(-1) for s in slots]).to(self.device)
        if flat.shape[0] != rows.shape[0]:
            raise ValueError(f"{rows.shape[0]} encoder positions but {flat.shape[0]} slots")
        for layer in range(len(self.layers)):
            k, v = self.cross_kv(layer, rows)
            cross.write(layer, flat, k, v)
