"""Attention backends behind one interface (base.AttentionBackend):
reference (per-row SDPA loop, what tests compare against), cpu (bucketed
batched SDPA over gathered pages, the CPU default), triton (Triton kernels
over the paged cache, the CUDA default) and flex (FlexAttention over the
paged cache, an option on CUDA)."""

from __future__ import annotations

import torch

from .base import AttentionBackend, AttentionMetadata, StepAttention
from .cpu import CpuBackend
from .flex import FlexBackend
from .kv_cache import KVCache
from .reference import ReferenceBackend, RowSpan, paged_attention

from ..runtime.options import ATTENTION_BACKENDS as BACKENDS


def make_backend(name: str, cache: KVCache, num_heads: int, scale: float, windows: list[int | None]) -> AttentionBackend:
    device = cache.layers[0].device
    if name == "auto":
        name = "triton" if device.type == "cuda" else "cpu"
    if name == "reference":
        return ReferenceBackend(cache, num_heads, scale, windows)
    if name == "cpu":
        return CpuBackend(cache, num_heads, scale, windows)
    if name == "triton":
        # Imported here: triton is needed only where this backend is chosen.
        from .triton_attention import TritonBackend

        return TritonBackend(cache, num_heads, scale, windows)
    if name == "flex":
        # Compiled kernels on CUDA; eager (exact but dense, slow) elsewhere.
        return FlexBackend(cache, num_heads, scale, windows, compile=device.type == "cuda")
    raise ValueError(f"unknown attention backend {name!r}; expected one of {', '.join(BACKENDS)}")


__all__ = [
    "AttentionBackend", "AttentionMetadata", "BACKENDS", "CpuBackend", "FlexBackend",
    "ReferenceBackend", "RowSpan", "StepAttention", "make_backend", "paged_attention",
]
