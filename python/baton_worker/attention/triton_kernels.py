"""Triton kernels for attention over the paged KV cache.

The cache of a layer is one contiguous tensor [2, kv_heads, slots, head_dim]
(attention/kv_cache.py); a key's slot is block_table[row, position // block_size] *
block_size + position % block_size. Every kernel gathers K/V by slot, so any
block size works and a page shared through the prefix cache needs nothing
special.

- write_kv: the step's new K and V into their slots, both in one launch.
- decode: one query per row (flash-decoding). A program takes one row, one KV
  head and one split of the row's context; the query heads that share the KV
  head are the rows of its tiles (GQA: K/V are read once per group). With more
  than one split, each program leaves a partial result (output normalised by
  its own softmax sum, and the sum's log) and a second kernel merges the
  splits; with one split the first kernel writes the output itself.
- extend: prefill chunks (and prefix hits): a program takes a tile of a row's
  new queries, times the query heads of one KV head, and walks the row's keys
  up to the tile's last query, with the causal and sliding-window masks.

The softmax runs in base 2 (scores pre-multiplied by log2(e) * scale).
Masked scores are -inf while the running maximum starts at a finite -1e30, so
a tile with no visible key adds exactly nothing and no NaN appears.

Each kernel is tested against the reference backend on CPU tensors under
TRITON_INTERPRET=1 (python/tests/test_triton_attention.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Below this, running maxima are "nothing seen yet"; finite so exp2(m_old - m_new) is never NaN.
_NEG = tl.constexpr(-1.0e30)


@triton.jit
def write_kv_kernel(
    k_ptr, v_ptr, cache_ptr, slots_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, cache_kv_stride, cache_head_stride,
    KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, D_PAD)[None, :]
    mask = (h < KV_HEADS) & (d < D)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    dst = cache_ptr + h * cache_head_stride + slot * D + d
    tl.store(dst, k, mask=mask)
    tl.store(dst + cache_kv_stride, v, mask=mask)


@triton.jit
def _attend(
    q, q_pos, k_base, v_base, table, lo, hi, window, scale_log2, d, d_ok,
    ROWS: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Online softmax of the query rows q [ROWS, D_PAD] (at positions q_pos) over
    the keys at positions [lo, hi) of one KV head, in tiles of TILE_N keys found
    through the row's page table; a key counts for a row when it is at or before
    the row's position and inside its window. Returns the running maximum, sum
    and unnormalised output (base 2)."""
    m_i = tl.full([ROWS], _NEG, tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D_PAD], tl.float32)
    for n0 in range(lo, hi, TILE_N):
        pos = n0 + tl.arange(0, TILE_N)
        valid = pos < hi
        block = tl.load(table + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
        slot = block * BLOCK_SIZE + pos % BLOCK_SIZE
        kv_mask = valid[:, None] & d_ok
        k = tl.load(k_base + slot[:, None] * D + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        seen = valid[None, :] & (pos[None, :] <= q_pos[:, None]) & (pos[None, :] > q_pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + slot[:, None] * D + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def decode_kernel(
    q_ptr, cache_ptr, table_ptr, seq_lens_ptr, q_index_ptr, out_ptr, part_o_ptr, part_lse_ptr,
    scale_log2, window,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_table, cache_kv_stride, cache_head_stride,
    HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, SPLITS: tl.constexpr, PRECISION: tl.constexpr,
):
    r = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + r)
    # The query is the last position; HF's window rule keeps keys > query - window.
    first = tl.maximum(seq_len - window, 0)
    per_split = tl.cdiv(tl.cdiv(seq_len - first, SPLITS), TILE_N) * TILE_N
    start = first + split * per_split
    end = tl.minimum(start + per_split, seq_len)

    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, D_PAD)
    head = kvh * GROUP + g
    d_ok = d[None, :] < D
    t = tl.load(q_index_ptr + r).to(tl.int64)
    q = tl.load(q_ptr + t * stride_qt + head[:, None] * stride_qh + d[None, :], mask=(g[:, None] < GROUP) & d_ok, other=0.0)

    q_pos = tl.zeros([GROUP_PAD], tl.int32) + (seq_len - 1)
    k_base = cache_ptr + kvh * cache_head_stride
    m_i, l_i, acc = _attend(q, q_pos, k_base, k_base + cache_kv_stride, table_ptr + r * stride_table, start, end, window, scale_log2,
                            d, d_ok, GROUP_PAD, D, D_PAD, BLOCK_SIZE, TILE_N, PRECISION)

    g_ok = g < GROUP
    if SPLITS == 1:
        out = acc / l_i[:, None]
        tl.store(out_ptr + t * stride_ot + head[:, None] * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=g_ok[:, None] & d_ok)
    else:
        # An empty split (short context) leaves lse = -inf and weighs nothing in the merge.
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        at = (r * HEADS + head) * SPLITS + split
        tl.store(part_o_ptr + at[:, None] * D_PAD + d[None, :], out, mask=g_ok[:, None])
        tl.store(part_lse_ptr + at, lse, mask=g_ok)


@triton.jit
def merge_splits_kernel(
    part_o_ptr, part_lse_ptr, q_index_ptr, out_ptr, stride_ot, stride_oh,
    HEADS: tl.constexpr, SPLITS: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, D_PAD)
    at = (r * HEADS + h) * SPLITS + s
    lse = tl.load(part_lse_ptr + at)
    weight = tl.exp2(lse - tl.max(lse, 0))
    weight = weight / tl.sum(weight, 0)
    parts = tl.load(part_o_ptr + at[:, None] * D_PAD + d[None, :])
    out = tl.sum(parts * weight[:, None], 0)
    t = tl.load(q_index_ptr + r).to(tl.int64)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


@triton.jit
def extend_kernel(
    q_ptr, cache_ptr, table_ptr, seq_lens_ptr, query_start_ptr, tile_row_ptr, tile_first_ptr, out_ptr,
    scale_log2, window,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_table, cache_kv_stride, cache_head_stride,
    GROUP: tl.constexpr, TOKENS: tl.constexpr, M: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    r = tl.load(tile_row_ptr + tile)
    t0 = tl.load(tile_first_ptr + tile)  # the tile's first query, counted within the row
    q_begin = tl.load(query_start_ptr + r)
    q_len = tl.load(query_start_ptr + r + 1) - q_begin
    seq_len = tl.load(seq_lens_ptr + r)
    context = seq_len - q_len  # position of the row's first new token

    m = tl.arange(0, M)
    tok = t0 + m // GROUP
    head = kvh * GROUP + m % GROUP
    row_ok = (m < TOKENS * GROUP) & (tok < q_len)
    q_pos = context + tok
    d = tl.arange(0, D_PAD)
    d_ok = d[None, :] < D
    q_row = (q_begin + tok).to(tl.int64)
    q = tl.load(q_ptr + q_row[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=row_ok[:, None] & d_ok, other=0.0)

    lo = tl.maximum(context + t0 - window + 1, 0)
    hi = tl.minimum(context + t0 + TOKENS, seq_len)
    k_base = cache_ptr + kvh * cache_head_stride
    m_i, l_i, acc = _attend(q, q_pos, k_base, k_base + cache_kv_stride, table_ptr + r * stride_table, lo, hi, window, scale_log2,
                            d, d_ok, M, D, D_PAD, BLOCK_SIZE, TILE_N, PRECISION)

    out = acc / tl.where(row_ok, l_i, 1.0)[:, None]
    tl.store(out_ptr + q_row[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok)
