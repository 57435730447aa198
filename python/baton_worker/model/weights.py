"""Weight loading from an HF model directory (safetensors only, never pickle).

Accepts model.safetensors, or shards listed by model.safetensors.index.json, or
(as a fallback) every *.safetensors file in the directory. Tensors are looked up
by their HF parameter names and converted to the serving dtype/device one at a
time, so peak memory stays near the size of the converted weights.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ConfigError, ModelConfig, read_json


def weight_files(model_dir: Path) -> dict[str, Path]:
    """Maps each tensor name to the file holding it."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map") or {}
        if not weight_map:
            raise ConfigError(f"{index} has no weight_map")
        return {name: model_dir / file for name, file in weight_map.items()}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors weights in {model_dir}")
    mapping: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                mapping[name] = file
    return mapping


class WeightReader:
    """Reads named tensors, opening each file once."""

    def __init__(
        self,
        model_dir: Path,
        dtype: torch.dtype,
        device: torch.device,
        progress: Callable[[int, int], None] | None = None,
        rename: Callable[[str], str] | None = None,
    ):
        """rename: maps the names the caller asks for to the names stored (a
        composite model's decoder lives under a prefix)."""
        self.files = weight_files(model_dir)
        self.rename = rename
        self.dtype = dtype
        self.device = device
        self._open: dict[Path, object] = {}
        self._progress = progress
        self._loaded = 0

    def has(self, name: str) -> bool:
        return (self.rename(name) if self.rename else name) in self.files

    def get(self, name: str) -> torch.Tensor:
        if self.rename is not None:
            name = self.rename(name)
        file = self.files.get(name)
        if file is None:
            raise ConfigError(f"weight {name!r} not found in the model's safetensors files")
        handle = self._open.get(file)
        if handle is None:
            if not file.exists():
                raise ConfigError(f"weight file {file} (listed in the index) does not exist")
            handle = safe_open(str(file), framework="pt")
            self._open[file] = handle
        tensor = handle.get_tensor(name).to(device=self.device, dtype=self.dtype).contiguous()
        if self._progress is not None:
            self._loaded += 1
            # Some stored tensors are never read (a tied lm_head), so the end is reported by close().
            self._progress(min(self._loaded, len(self.files) - 1), len(self.files))
        return tensor

    def close(self) -> None:
        self._open.clear()
        if self._progress is not None:
            self._progress(len(self.files), len(self.files))


def stderr_progress() -> Callable[[int, int], None]:
    """Prints "BATON_PROGRESS <done> <total>" to stderr whenever the percentage changes."""
    last = -1

    def report(done: int, total: int) -> None:
        nonlocal last
        percent = done * 100 // max(total, 1)
        if percent != last:
            last = percent
            print(f"BATON_PROGRESS {done} {total}", file=sys.stderr, flush=True)

    return report


class RandomWeightReader:
    """--load-format dummy (vLLM's name): every weight the decoder asks for, of
    its shape from the model's config, drawn on the device (norms 1, the rest
    normal with std 0.02); no weight files are read. A weight depends only on
    the seed and its name, so the same seed gives the same model whatever
    reads it in whatever order (a tensor-parallel rank draws the whole tensor
    and keeps its slice). For benchmarks of shapes nobody ships weights for (an
    8B model on a GPU in seconds instead of writing 16 GB).

    residual_scale (--model-loader-extra-config) multiplies the std of the
    weights that write into the residual stream (o_proj, down_proj): near 0,
    the layers add little to each token's embedding, so a tied model predicts
    its input token again and greedy output repeats it. That gives speculative
    decoding a workload it can draft at any model shape; the cost of a forward
    does not depend on the values."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int, residual_scale: float = 1.0):
        self.shapes = _decoder_shapes(config)
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self.residual_scale = residual_scale

    def has(self, name: str) -> bool:
        return name in self.shapes

    def get(self, name: str) -> torch.Tensor:
        shape = self.shapes.get(name)
        if shape is None:
            raise ConfigError(f"weight {name!r} is not one of the decoder's (--load-format dummy)")
        out = torch.empty(shape, dtype=self.dtype, device=self.device)
        if name.endswith("norm.weight"):
            return out.fill_(1.0)
        generator = torch.Generator(device=self.device).manual_seed(zlib.crc32(f"{self.seed}/{name}".encode()))
        writes_residual = name.endswith(("o_proj.weight", "down_proj.weight"))
        return out.normal_(0.0, 0.02 * (self.residual_scale if writes_residual else 1.0), generator=generator)

    def close(self) -> None:
        pass


def dummy_options(extra: dict | None) -> dict:
    """--model-loader-extra-config as RandomWeightReader's keyword arguments; ConfigError for a key or value it does not take."""
    extra = extra or {}
    unknown = sorted(set(extra) - {"residual_scale"})
    if unknown:
        raise ConfigError(f"--model-loader-extra-config: unknown key {unknown[0]!r} (--load-format dummy takes residual_scale)")
    if "residual_scale" not in extra:
        return {}
    scale = extra["residual_scale"]
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 <= scale <= 1:
        raise ConfigError(f"--model-loader-extra-config: residual_scale must be a number in [0, 1], got {scale!r}")
    return {"residual_scale": float(scale)}


def _decoder_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every weight of a Llama-family decoder with this config."""
    q, kv, h, i = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_size, c.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for layer in range(c.num_layers):
        p = f"model.layers.{layer}."
        a, m = p + "self_attn.", p + "mlp."
        shapes.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        shapes.update({a + "q_proj.weight": (q, h), a + "k_proj.weight": (kv, h), a + "v_proj.weight": (kv, h), a + "o_proj.weight": (h, q)})
        if c.moe is not None and c.moe.sparse_layers[layer]:
            e = c.moe.intermediate_size
            shapes[m + "gate.weight"] = (c.moe.num_experts, h)
            for x in range(c.moe.num_experts):
                x = f"{m}experts.{x}."
                shapes.update({x + "gate_proj.weight": (e, h), x + "up_proj.weight": (e, h), x + "down_proj.weight": (h, e)})
            s = c.moe.shared_intermediate_size
            if s:
                x = m + "shared_expert."
                shapes.update({x + "gate_proj.weight": (s, h), x + "up_proj.weight": (s, h), x + "down_proj.weight": (h, s)})
                shapes[m + "shared_expert_gate.weight"] = (1, h)
        else:
            shapes.update({m + "gate_proj.weight": (i, h), m + "up_proj.weight": (i, h), m + "down_proj.weight": (h, i)})
        if c.qkv_bias:
            shapes.update({a + "q_proj.bias": (q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,)})
        if c.o_bias:
            shapes[a + "o_proj.bias"] = (h,)
        if c.qk_norm:
            shapes.update({a + "q_norm.weight": (c.head_dim,), a + "k_norm.weight": (c.head_dim,)})
        if c.mlp_bias:
            shapes.update({m + "gate_proj.bias": (i,), m + "up_proj.bias": (i,), m + "down_proj.bias": (h,)})
    return shapes
