"""Triton kernels for multi-LoRA on CUDA, Punica-style (segmented gather
matrix-vector products, "shrink" then "expand").

The adapters of a step sit in slots of stacked weights, one stack per layer
and projection group: A [slots, modules * R, in] and B [slots, out, R], R
the --max-lora-rank (a smaller rank is padded with zeros, which add
nothing). The step's adapter tokens are listed sorted by adapter (`order`,
indices into the packed tokens), and cut into tiles of at most BLOCK_M
tokens of one adapter: (first entry of order, end of its segment, slot).

- shrink: t[j] = x[order[j]] @ A[slot]^T, float32 [tokens, modules * R];
- expand: y[order[j], slice of module m] += t[j, m * R : (m + 1) * R] @ B[slot, slice]^T.

One launch each per projection group, the grid over (tiles, output tiles);
the fused q/k/v or gate/up output gets each module's delta in its own slice.
Base-model tokens are not in `order`, so they cost nothing. Products are
float32 (input_precision "ieee": no TF32 for float32 weights) and y is
rounded once.

Tested against the torch path (batch.py) on CPU tensors under
TRITON_INTERPRET=1 (python/tests/test_lora.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Tokens per tile: the M of tl.dot (at least 16 on a GPU).
BLOCK_M = 16


@triton.jit
def _tile(tiles_ptr, order_ptr, BLOCK_M: tl.constexpr):
    """Tile program_id(0): its adapter's slot, its entries of order (rows, masked past the
    segment's end) and the packed tokens they name."""
    tile = tl.program_id(0)
    first = tl.load(tiles_ptr + 3 * tile)
    end = tl.load(tiles_ptr + 3 * tile + 1)
    slot = tl.load(tiles_ptr + 3 * tile + 2).to(tl.int64)
    rows = first + tl.arange(0, BLOCK_M)
    row_mask = rows < end
    tokens = tl.load(order_ptr + rows, mask=row_mask, other=0)
    return slot, rows, row_mask, tokens


@triton.jit
def lora_shrink_kernel(
    x_ptr, a_ptr, out_ptr, order_ptr, tiles_ptr,
    stride_x, stride_a_slot, stride_a_row, stride_out, K, N,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """out[j, :N] = x[order[j], :K] @ a[slot, :N, :K]^T for the entries j of tile program_id(0)."""
    slot, rows, row_mask, tokens = _tile(tiles_ptr, order_ptr, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < K
        x = tl.load(x_ptr + tokens[:, None] * stride_x + ks[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        a = tl.load(
            a_ptr + slot * stride_a_slot + cols[None, :] * stride_a_row + ks[:, None],
            mask=k_mask[:, None] & col_mask[None, :], other=0.0,
        )
        acc += tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision="ieee")
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], acc, mask=row_mask[:, None] & col_mask[None, :])


@triton.jit
def lora_expand_kernel(
    t_ptr, b_ptr, y_ptr, order_ptr, tiles_ptr, bounds_ptr,
    stride_t, stride_b_slot, stride_b_row, stride_y, R, TILES_PER_MODULE,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """y[order[j], c] += t[j, m * R : (m + 1) * R] @ b[slot, c, :R] for the columns c of module m's
    slice [bounds[m], bounds[m + 1]) in output tile program_id(1) (m = program_id(1) // TILES_PER_MODULE)."""
    pid = tl.program_id(1)
    m = pid // TILES_PER_MODULE
    lo = tl.load(bounds_ptr + m)
    hi = tl.load(bounds_ptr + m + 1)
    cols = lo + (pid % TILES_PER_MODULE) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < hi
    slot, rows, row_mask, tokens = _tile(tiles_ptr, order_ptr, BLOCK_M)
    delta = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        r_mask = r < R
        t = tl.load(t_ptr + rows[:, None] * stride_t + m * R + r[None, :], mask=row_mask[:, None] & r_mask[None, :], other=0.0)
        b = tl.load(
            b_ptr + slot * stride_b_slot + cols[None, :] * stride_b_row + r[:, None],
            mask=r_mask[:, None] & col_mask[None, :], other=0.0,
        )
        delta += tl.dot(t, b.to(tl.float32), input_precision="ieee")
    mask = row_mask[:, None] & col_mask[None, :]
    y_ptrs = y_ptr + tokens[:, None] * stride_y + cols[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + delta).to(y.dtype), mask=mask)


def _block(n: int, least: int = 16, most: int = 128) -> int:
    return max(least, min(most, triton.next_power_of_2(n)))


def lora_shrink(x: torch.Tensor, a: torch.Tensor, order: torch.Tensor, tiles: torch.Tensor) -> torch.Tensor:
    """x [T, in] (rows contiguous), a [slots, N, in], order [J] int64, tiles [n, 3] int32 -> float32 [J, N]."""
    n = a.shape[1]
    out = torch.empty(order.shape[0], n, dtype=torch.float32, device=x.device)
    assert x.stride(1) == 1 and a.stride(2) == 1
    block_n = _block(n)
    grid = (tiles.shape[0], triton.cdiv(n, block_n))
    lora_shrink_kernel[grid](
        x, a, out, order, tiles, x.stride(0), a.stride(0), a.stride(1), out.stride(0), x.shape[1], n,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=_block(x.shape[1], 16, 64),
    )
    return out


def lora_expand(y: torch.Tensor, t: torch.Tensor, b: torch.Tensor, order: torch.Tensor, tiles: torch.Tensor,
                bounds: torch.Tensor, widest: int) -> None:
    """In place: y [T, out] += each module's t @ b^T in its slice. b [slots, out, R]; bounds [modules + 1]
    int32 on the device (the slices); widest: the widest slice (sizes the grid)."""
    modules = bounds.shape[0] - 1
    rank = b.shape[2]
    assert y.stride(1) == 1 and b.stride(2) == 1 and t.shape[1] == modules * rank
    block_n = _block(widest, 16, 64)
    per_module = triton.cdiv(widest, block_n)
    grid = (tiles.shape[0], modules * per_module)
    lora_expand_kernel[grid](
        t, b, y, order, tiles, bounds, t.stride(0), b.stride(0), b.stride(1), y.stride(0), rank, per_module,
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_R=_block(rank, 16, 64),
    )
