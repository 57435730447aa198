"""What every attention backend sees: step metadata built once per step, and
one call per layer that writes the new tokens' K/V into the paged cache and
attends over each row's context.

Rows are the requests with at least one new token this step, in batch order;
their new tokens are contiguous in the flat batch (query_start). A row's
context is its first seq_lens[r] positions; the new tokens are the last
q_len of them, so causality inside a prefill chunk is position <= query position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .kv_cache import KVCache


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64 on the device: cache slot of each new token
    query_start: np.ndarray  # [R + 1] int64: row r's new tokens are [query_start[r], query_start[r + 1])
    seq_lens: np.ndarray  # [R] int64: context length of each row after this step
    block_table: torch.Tensor  # [R, >= max pages] int64 on the device; unused entries are 0
    block_size: int

    @property
    def num_rows(self) -> int:
        return len(self.seq_lens)

    @property
    def q_lens(self) -> np.ndarray:
        return np.diff(self.query_start)


class StepAttention(Protocol):
    """One step's attention, as the layers call it."""

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class AttentionBackend:
    """prepare() once per step returns what run() reads once per layer. The
    CPU-side backends keep that state on themselves (and return self); the
    Triton backend returns a plan object that owns it, which a captured CUDA
    graph can keep."""

    name = "base"

    def __init__(self, cache: KVCache, num_heads: int, scale: float, windows: list[int | None]):
        self.cache = cache
        self.num_heads = num_heads
        self.num_kv_heads = cache.num_kv_heads
        self.head_dim = cache.head_dim
        self.scale = scale
        self.windows = windows  # per layer: sliding window, or None

    def prepare(self, meta: AttentionMetadata) -> StepAttention:
        raise NotImplementedError

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, heads, head_dim]; k, v: [T, kv_heads, head_dim] -> [T, heads, head_dim]."""
        raise NotImplementedError


@dataclass
class Bucket:
    """Rows attended in one padded call: P rows, q_max queries, pages blocks of context each."""

    rows: np.ndarray  # [P] row indices
    q_max: int
    pages: int
    token_index: np.ndarray  # [P * q_max] flat-batch token per padded query (padding repeats the row's last token)
    q_pos: np.ndarray  # [P, q_max] position of each padded query
    dest: np.ndarray | None  # [n] flat-batch token of each real query; None when nothing is padding
    real: np.ndarray | None  # [n] index of each real query among the P * q_max


def _pow2_ceil(x: np.ndarray) -> np.ndarray:
    return np.left_shift(1, np.ceil(np.log2(np.maximum(x, 1))).astype(np.int64))


def buckets(meta: AttentionMetadata) -> list[Bucket]:
    """Groups rows so that padding costs at most 2x: decodes (one query) apart
    from prefill chunks, queries and context pages each rounded up to a power of 2."""
    q_lens = meta.q_lens
    pages = -(-meta.seq_lens // meta.block_size)
    keys = _pow2_ceil(q_lens) * (1 << 32) + _pow2_ceil(pages)
    out = []
    for key in np.unique(keys):
        rows = np.flatnonzero(keys == key)
        q_len = q_lens[rows]
        q_max = int(q_len.max())
        offset = np.minimum(np.arange(q_max)[None, :], q_len[:, None] - 1)
        token_index = (meta.query_start[rows][:, None] + offset).ravel()
        q_pos = (meta.seq_lens[rows] - q_len)[:, None] + offset
        dest = real = None
        if (q_len != q_max).any():
            real_mask = (np.arange(q_max)[None, :] < q_len[:, None]).ravel()
            real = np.flatnonzero(real_mask)
            dest = token_index[real]
        out.append(Bucket(rows, q_max, int(pages[rows].max()), token_index, q_pos, dest, real))
    return out


def allowed(q_pos: np.ndarray, context: int, window: int | None) -> np.ndarray:
    """[P, q_max, context] bool: which key positions each query attends (causal,
    HF's sliding-window rule: key > query - window). Keys past a row's context
    are after its last query, so causality masks them too."""
    k_pos = np.arange(context)[None, None, :]
    ok = k_pos <= q_pos[:, :, None]
    if window is not None:
        ok &= k_pos > q_pos[:, :, None] - window
    return ok
