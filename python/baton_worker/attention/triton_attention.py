"""The CUDA backend: Triton kernels over the paged cache (triton_kernels.py).

prepare() turns a step's metadata into a TritonPlan: the rows split into
decodes (one query: the split-KV decode kernel) and extends (prefill chunks,
prefix hits: the extend kernel, in tiles of queries), with every index the
kernels read uploaded in one copy. A plan holds all the tensors its kernels
read, so a CUDA graph captured through a plan stays valid for as long as the
graph keeps the plan (cuda_graphs.py).

On CPU the same kernels run under TRITON_INTERPRET=1 (slowly): that is how
the tests compare them with the reference backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .. import triton_interpreter  # noqa: F401  (under TRITON_INTERPRET=1, fixes the interpreter first)
from .base import AttentionBackend, AttentionMetadata

# A window this wide is no window (the kernels take the window as a plain int).
NO_WINDOW = 1 << 30
# Keys per tile of the decode and extend loops.
TILE_N = 64
# Query rows (query tokens x the query heads of one KV head) per extend program.
EXTEND_ROWS = 64
# A split of a decode row's context covers at least this many keys when the length is known.
MIN_SPLIT_KEYS = 256
MAX_SPLITS = 16


def _pow2_ceil(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


@dataclass
class DecodeRows:
    q_index: torch.Tensor  # [D] the flat-batch token of each decode row
    seq_lens: torch.Tensor  # [D] int32
    table: torch.Tensor  # [D, pages] block ids
    splits: int


@dataclass
class ExtendTiles:
    query_start: torch.Tensor  # [R + 1] of every row of the step
    seq_lens: torch.Tensor  # [R] int32
    table: torch.Tensor  # [R, pages]
    tile_row: torch.Tensor  # [tiles] row of each program
    tile_first: torch.Tensor  # [tiles] first query of the program, within its row
    tokens: int  # query tokens per tile


class TritonPlan:
    """One step's attention: what every layer's run() reads."""

    def __init__(self, backend: TritonBackend, slots: torch.Tensor, decode: DecodeRows | None, extend: ExtendTiles | None):
        self.backend, self.slots, self.decode, self.extend = backend, slots, decode, extend

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b = self.backend
        cache = b.cache.layers[layer]
        b.write_kv(cache, self.slots, k, v)
        out = torch.empty_like(q)
        window = b.windows[layer] or NO_WINDOW
        if self.decode is not None:
            b.decode(cache, q, out, self.decode, window)
        if self.extend is not None:
            b.extend(cache, q, out, self.extend, window)
        return out


class TritonBackend(AttentionBackend):
    name = "triton"

    def __init__(self, *args, tile_n: int = TILE_N, num_warps: int = 4, **kwargs):
        """tile_n, num_warps: keys per tile and warps per program of the decode and
        extend kernels (bench/gpu/attention_kernels.py compares settings)."""
        super().__init__(*args, **kwargs)
        from . import triton_kernels

        self.tile_n, self.num_warps = tile_n, num_warps
        self.kernels = triton_kernels
        self.group = self.num_heads // self.num_kv_heads
        cache = self.cache.layers[0]
        self.device = cache.device
        self.d_pad = max(16, _pow2_ceil(self.head_dim))
        # float32 dots in full precision (the default would round operands to tf32): greedy parity in float32.
        self.precision = "ieee" if cache.dtype == torch.float32 else "tf32"
        self.scale_log2 = self.scale * 1.4426950408889634
        self.staging: list[torch.Tensor | None] = [None, None]  # pinned host buffers of the one upload per step
        self.uploads = 0
        self.sm_count = torch.cuda.get_device_properties(self.device).multi_processor_count if self.device.type == "cuda" else 4

    # ------------------------------------------------------------ plans

    def decode_splits(self, rows: int, max_seq_len: int | None) -> int:
        """Splits per decode row: enough programs to fill the GPU twice over, none
        shorter than MIN_SPLIT_KEYS keys when the length is known (graphs do not know it)."""
        want = -(-2 * self.sm_count // max(rows * self.num_kv_heads, 1))
        if max_seq_len is not None:
            want = min(want, -(-max_seq_len // MIN_SPLIT_KEYS))
        return min(_pow2_floor(want), MAX_SPLITS)

    def prepare(self, meta: AttentionMetadata) -> TritonPlan:
        q_lens = meta.q_lens
        is_decode = q_lens == 1
        decode_rows = np.flatnonzero(is_decode)
        n = meta.num_rows
        all_decode = len(decode_rows) == n
        extend_rows = np.zeros(0, np.int64) if all_decode else np.flatnonzero(~is_decode & (q_lens > 0))
        tokens = max(1, EXTEND_ROWS // self.group)
        tiles = -(-q_lens[extend_rows] // tokens)
        tile_row = np.repeat(extend_rows, tiles)
        tile_first = (np.arange(len(tile_row)) - np.repeat(np.cumsum(tiles) - tiles, tiles)) * tokens
        # One int32 buffer, one copy: seq_lens, query_start, decode q_index, decode seq_lens, tiles.
        parts = [meta.seq_lens, meta.query_start, meta.query_start[decode_rows], meta.seq_lens[decode_rows], tile_row, tile_first]
        host = np.concatenate(parts).astype(np.int32)
        flat = torch.from_numpy(host) if self.device.type == "cpu" else self._upload(host)
        views, at = [], 0
        for p in parts:
            views.append(flat[at : at + len(p)])
            at += len(p)
        seq_lens, query_start, q_index, decode_lens, tile_row_t, tile_first_t = views
        decode = extend = None
        if len(decode_rows):
            table = meta.block_table if all_decode else meta.block_table[torch.from_numpy(decode_rows).to(self.device, non_blocking=True)]
            splits = self.decode_splits(len(decode_rows), int(meta.seq_lens[decode_rows].max()))
            decode = DecodeRows(q_index, decode_lens, table, splits)
        if len(tile_row):
            extend = ExtendTiles(query_start, seq_lens, meta.block_table, tile_row_t, tile_first_t, tokens)
        return TritonPlan(self, meta.slot_mapping, decode, extend)

    def _upload(self, host: np.ndarray) -> torch.Tensor:
        # Two pinned buffers in turn: the previous step's copy may still be queued
        # (overlapped steps), the one before it has run.
        turn = self.uploads % 2
        self.uploads += 1
        if self.staging[turn] is None or self.staging[turn].numel() < len(host):
            self.staging[turn] = torch.empty(max(2 * len(host), 4096), dtype=torch.int32).pin_memory()
        staged = self.staging[turn][: len(host)]
        staged.numpy()[:] = host
        return staged.to(self.device, non_blocking=True)

    def decode_plan(self, slots: torch.Tensor, q_index: torch.Tensor, seq_lens: torch.Tensor, table: torch.Tensor) -> TritonPlan:
        """A plan for decode-only steps over fixed tensors that the caller refills
        before each run (a captured graph's inputs); the split count depends only
        on the row count."""
        rows = len(q_index)
        return TritonPlan(self, slots, DecodeRows(q_index, seq_lens, table, self.decode_splits(rows, None)), None)

    # ------------------------------------------------------------ launches

    def write_kv(self, cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        t = k.shape[0]
        if t == 0:
            return
        self.kernels.write_kv_kernel[(t,)](
            k, v, cache, slots, k.stride(0), k.stride(1), v.stride(0), v.stride(1), cache.stride(0), cache.stride(1),
            KV_HEADS=self.num_kv_heads, HEADS_PAD=_pow2_ceil(self.num_kv_heads), D=self.head_dim, D_PAD=_pow2_ceil(self.head_dim),
        )

    def decode(self, cache: torch.Tensor, q: torch.Tensor, out: torch.Tensor, rows: DecodeRows, window: int) -> None:
        n, splits = len(rows.q_index), rows.splits
        if splits > 1:
            part_o = torch.empty(n * self.num_heads * splits * self.d_pad, dtype=torch.float32, device=q.device)
            part_lse = torch.empty(n * self.num_heads * splits, dtype=torch.float32, device=q.device)
        else:
            part_o = part_lse = out  # unused
        self.kernels.decode_kernel[(n, self.num_kv_heads, splits)](
            q, cache, rows.table, rows.seq_lens, rows.q_index, out, part_o, part_lse,
            self.scale_log2, window,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), rows.table.stride(0), cache.stride(0), cache.stride(1),
            HEADS=self.num_heads, GROUP=self.group, GROUP_PAD=max(16, _pow2_ceil(self.group)), D=self.head_dim, D_PAD=self.d_pad,
            BLOCK_SIZE=self.cache.block_size, TILE_N=self.tile_n, SPLITS=splits, PRECISION=self.precision, num_warps=self.num_warps,
        )
        if splits > 1:
            self.kernels.merge_splits_kernel[(n, self.num_heads)](
                part_o, part_lse, rows.q_index, out, out.stride(0), out.stride(1),
                HEADS=self.num_heads, SPLITS=splits, D=self.head_dim, D_PAD=self.d_pad,
            )

    def extend(self, cache: torch.Tensor, q: torch.Tensor, out: torch.Tensor, tiles: ExtendTiles, window: int) -> None:
        self.kernels.extend_kernel[(len(tiles.tile_row), self.num_kv_heads)](
            q, cache, tiles.table, tiles.seq_lens, tiles.query_start, tiles.tile_row, tiles.tile_first, out,
            self.scale_log2, window,
            q.stride(0), q.stride(1), out.stride(0), out.stride(1), tiles.table.stride(0), cache.stride(0), cache.stride(1),
            GROUP=self.group, TOKENS=tiles.tokens, M=max(16, _pow2_ceil(tiles.tokens * self.group)), D=self.head_dim,
            D_PAD=self.d_pad, BLOCK_SIZE=self.cache.block_size, TILE_N=self.tile_n, PRECISION=self.precision, num_warps=self.num_warps,
        )
