"""Cross-attention over the paged KV cache (an encoder-decoder's decoder
attending its request's encoder output, as Whisper's does).

The encoder output's K/V are computed once per request and written to blocks
of the same KVCache as self-attention (same layers, heads and head_dim), in
a block list of their own that the engine gives each request next to its
self-attention block table. Position p of a request's encoder output lives
in cross block p // block_size at offset p % block_size.

Per step, prepare() groups the rows as the CPU backend does (base.buckets:
decodes apart from prefill chunks, queries and pages each rounded up to a
power of 2, so padding costs at most 2x) and run() does, per layer, one
index_select that gathers every row's cross blocks for all heads, then one
SDPA per group. There is no causal mask: every query sees all of its row's
encoder positions; only the keys that block rounding adds past a row's
length are masked. Plain torch, so it runs on CPU and CUDA alike.

Cross K/V never change once written, so on a CPU a step whose rows hold the
same cross blocks, in the same order, as the previous step's (the decode
steps of an unchanged batch) reads the previous step's gathers again instead
of copying the blocks out once more (up to KEEP_BYTES of gathers for all
layers; any write forgets them).

Queries come already scaled (Whisper multiplies q by head_dim ** -0.5 before
the product, as transformers does), so SDPA runs with scale 1.0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from .base import AttentionMetadata, StepAttention, buckets
from .kv_cache import KVCache

# The most bytes of gathered cross K/V (all layers) a CPU worker keeps for the next step.
KEEP_BYTES = 256 * 1024 * 1024


@dataclass
class _Group:
    """Rows attended in one padded SDPA call."""

    rows: int  # P
    q_max: int
    pages: int  # cross blocks per row (context = pages * block_size)
    first_page: int  # where this group's blocks start in the step's gather
    token_index: torch.Tensor | None  # [P * q_max] flat-batch token per padded query; None: arange(T)
    mask: torch.Tensor | None  # [1, P, 1, context] additive; None when no row has keys past its length
    dest: torch.Tensor | None  # [n] flat-batch token of each real query; None when nothing is padding
    real: torch.Tensor | None  # [n] index of each real query among the P * q_max


class CrossPlan:
    """One step's cross-attention: run(layer, q) per decoder layer."""

    def __init__(self, owner: CrossAttention, groups: list[_Group], pages: torch.Tensor, num_tokens: int, keep: bool = False):
        self.owner = owner
        self.groups = groups
        self.pages = pages  # [sum of P * pages] block ids, group after group, row-major
        self.num_tokens = num_tokens
        self.keep = keep  # the gathers are kept across steps (owner._kept)

    def run(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q: [T, heads, head_dim], already scaled -> [T, heads, head_dim]."""
        o = self.owner
        kvh, group, d = o.num_kv_heads, o.group, o.head_dim
        if q.shape[0] != self.num_tokens:
            raise ValueError(f"cross-attention was prepared for {self.num_tokens} queries; got {q.shape[0]}")
        if not self.groups:
            return torch.empty_like(q)
        kv_all = o.gather(layer, self.pages, self.keep)  # [2 * kv_heads, pages, block_size * head_dim]
        out = None
        for g in self.groups:
            context = g.pages * o.cache.block_size
            kv = kv_all[:, g.first_page : g.first_page + g.rows * g.pages].view(2, kvh, g.rows, context, d)
            qb = q if g.token_index is None else q.index_select(0, g.token_index)
            # [P * q_max, heads, d] -> [kv_heads, P, group * q_max, d]: query heads sharing a KV head fold into the query axis.
            qb = qb.view(g.rows, g.q_max, kvh, group, d).permute(2, 0, 3, 1, 4).reshape(kvh, g.rows, group * g.q_max, d)
            y = F.scaled_dot_product_attention(qb, kv[0], kv[1], attn_mask=g.mask, scale=1.0)
            y = y.view(kvh, g.rows, group, g.q_max, d).permute(1, 3, 0, 2, 4).reshape(g.rows * g.q_max, kvh * group, d)
            if g.token_index is None:
                return y
            if out is None:
                out = torch.empty_like(q)
            if g.real is None:
                out.index_copy_(0, g.token_index, y)
            else:
                out.index_copy_(0, g.dest, y.index_select(0, g.real))
        assert out is not None
        return out


class CrossAttention:
    """Writes encoder K/V into a request's cross blocks and plans each step's cross-attention over them."""

    def __init__(self, cache: KVCache, num_heads: int):
        if num_heads % cache.num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not share {cache.num_kv_heads} KV heads evenly")
        self.cache = cache
        self.num_heads = num_heads
        self.num_kv_heads = cache.num_kv_heads
        self.head_dim = cache.head_dim
        self.group = num_heads // cache.num_kv_heads
        self.device = cache.layers[0].device
        # Reused by every layer's gather: a fresh tensor of that size costs more in page faults than the copy.
        self.workspace = torch.empty(0, dtype=cache.layers[0].dtype, device=self.device)
        # The last kept step's block ids (flattened as its plan gathers them) and each layer's gather.
        self._kept_pages: np.ndarray | None = None
        self._kept: dict[int, torch.Tensor] = {}

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots [N] int64; k, v [N, kv_heads, head_dim]."""
        self._forget()
        self.cache.write(layer, slots, k, v)

    def _forget(self) -> None:
        self._kept_pages = None
        self._kept.clear()

    def slots(self, block_ids: np.ndarray, length: int) -> np.ndarray:
        """[length] int64: the cache slots of positions 0..length-1 through the block list."""
        bs = self.cache.block_size
        blocks = np.asarray(block_ids, dtype=np.int64)
        if len(blocks) * bs < length:
            raise ValueError(f"{len(blocks)} blocks of {bs} cannot hold {length} positions")
        positions = np.arange(length, dtype=np.int64)
        return blocks[positions // bs] * bs + positions % bs

    def gather(self, layer: int, pages: torch.Tensor, keep: bool = False) -> torch.Tensor:
        """The blocks `pages` of a layer, all heads, K and V: [2 * kv_heads, len(pages), block_size * head_dim].
        keep: the same pages as the kept step's (reused if gathered already, else gathered and kept)."""
        if keep:
            kept = self._kept.get(layer)
            if kept is None:
                kept = self._kept[layer] = torch.index_select(self.cache.blocks(layer), 1, pages)
            return kept
        blocks = self.cache.blocks(layer)
        numel = blocks.shape[0] * pages.numel() * blocks.shape[2]
        if self.workspace.numel() < numel:
            self.workspace = torch.empty(numel, dtype=blocks.dtype, device=blocks.device)
        out = self.workspace[:numel].view(blocks.shape[0], pages.numel(), blocks.shape[2])
        torch.index_select(blocks, 1, pages, out=out)
        return out

    def prepare(self, block_tables: list[np.ndarray], lengths: np.ndarray, query_start: np.ndarray) -> CrossPlan:
        """Row r's queries are [query_start[r], query_start[r + 1]) of the flat batch (at least one) and
        attend positions 0..lengths[r]-1 of its cross blocks block_tables[r]."""
        bs = self.cache.block_size
        lengths = np.asarray(lengths, dtype=np.int64)
        query_start = np.asarray(query_start, dtype=np.int64)
        if len(block_tables) != len(lengths) or len(query_start) != len(lengths) + 1:
            raise ValueError("cross-attention needs one block list, one length and one query span per row")
        if len(lengths) and (lengths.min() < 1 or np.diff(query_start).min() < 1):
            raise ValueError("every cross-attention row needs at least one query and one encoder position")
        needed = -(-lengths // bs)
        for r, table in enumerate(block_tables):
            if len(table) < needed[r]:
                raise ValueError(f"row {r}: {len(table)} cross blocks cannot hold {lengths[r]} positions")
        # base.buckets groups by query count and pages; its causal positions are not used here.
        meta = AttentionMetadata(torch.empty(0, dtype=torch.int64), query_start, lengths, torch.empty(0, dtype=torch.int64), bs)
        groups: list[_Group] = []
        pages: list[np.ndarray] = []
        first = 0
        as_tensor = lambda a: None if a is None else torch.from_numpy(a).to(self.device)  # noqa: E731
        grouped = buckets(meta)
        for b in grouped:
            table = np.empty((len(b.rows), b.pages), dtype=np.int64)
            for i, r in enumerate(b.rows.tolist()):
                own = np.asarray(block_tables[r][: needed[r]], dtype=np.int64)
                table[i, : len(own)] = own
                table[i, len(own) :] = own[-1]  # any real block: masked below
            pages.append(table.ravel())
            context = b.pages * bs
            mask = None
            if (lengths[b.rows] < context).any():
                ok = np.arange(context)[None, :] < lengths[b.rows][:, None]
                mask = torch.zeros(ok.shape, dtype=self.workspace.dtype).masked_fill_(torch.from_numpy(~ok), float("-inf"))
                mask = mask.to(self.device)[None, :, None, :]
            groups.append(_Group(len(b.rows), b.q_max, b.pages, first, torch.from_numpy(b.token_index).to(self.device), mask,
                                 as_tensor(b.dest), as_tensor(b.real)))
            first += table.size
        num_tokens = int(query_start[-1]) if len(query_start) else 0
        # One group holding every token in order (no padding): its output is the step's output.
        if len(grouped) == 1 and grouped[0].real is None and np.array_equal(grouped[0].token_index, np.arange(num_tokens)):
            groups[0].token_index = None
        flat = np.concatenate(pages) if pages else np.zeros(0, dtype=np.int64)
        return CrossPlan(self, groups, torch.from_numpy(flat).to(self.device), num_tokens, self._keeps(flat))

    def _keeps(self, flat: np.ndarray) -> bool:
        """Whether this step's gathers are (or become) the kept ones: the same blocks as the kept step's, or,
        on a CPU, gathers small enough to keep for the next step."""
        if self._kept_pages is not None and np.array_equal(flat, self._kept_pages):
            return True
        self._forget()
        layers = len(self.cache.layers)
        numel = 2 * self.num_kv_heads * len(flat) * self.cache.block_size * self.head_dim
        if self.device.type != "cpu" or layers * numel * self.workspace.element_size() > KEEP_BYTES:
            return False
        self._kept_pages = flat
        return True


class CrossStepAttention(StepAttention, Protocol):
    """A step's attention for a decoder with cross-attention: run() as every backend's, plus cross()."""

    def cross(self, layer: int, q: torch.Tensor) -> torch.Tensor: ...


class _WithCross:
    def __init__(self, attention: StepAttention, plan: CrossPlan):
        self.attention = attention
        self.plan = plan

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.attention.run(layer, q, k, v)

    def cross(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        return self.plan.run(layer, q)


def with_cross(attention: StepAttention, plan: CrossPlan) -> CrossStepAttention:
    """The step's self-attention (what the backend's prepare() returned) and its cross-attention plan as one object."""
    return _WithCross(attention, plan)
