"""Triton kernels for the decoder layer's small operations, each one launch
where torch needs several: RMSNorm (optionally after the residual add),
rotary embeddings of q and k, and SiLU(gate) * up.

On a GPU a decode step of a small batch moves little data per operation, so
each launch costs its minimum time (a few microseconds) whatever it does;
torch's RMSNorm is eight launches and a rotation ten, about 1,000 launches
per step of a 32-layer model. These kernels round where transformers rounds
(to the activation dtype after each torch operation), so their results are
transformers' up to the order of a sum.

Tested against layer_ops.TorchOps on CPU tensors under TRITON_INTERPRET=1
(python/tests/test_layer_ops.py).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def rms_norm_kernel(
    x_ptr, delta_ptr, residual_ptr, weight_ptr, out_ptr, eps,
    stride_x, stride_xh, stride_delta, stride_residual, stride_out, N,
    HEADS: tl.constexpr, ADD: tl.constexpr, BLOCK: tl.constexpr,
):
    """out = weight * to_dtype(r * rsqrt(mean(r^2) + eps)), r = x (+ delta, written to residual) in float32.
    Row i of x is x[i // HEADS, i % HEADS] (HEADS > 1: per-head norms of [tokens, heads, head_dim])."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + (row // HEADS) * stride_x + (row % HEADS) * stride_xh + cols, mask=mask, other=0.0)
    if ADD:
        d = tl.load(delta_ptr + row * stride_delta + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)  # torch's add: in float32, rounded once
        tl.store(residual_ptr + row * stride_residual + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, axis=0) / N
    normed = (x32 * tl.math.rsqrt(variance + eps)).to(x.dtype)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    out = (w.to(tl.float32) * normed.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)


@triton.jit
def _mul(a, b, UNFUSED: tl.constexpr):
    # The compiler contracts a product and a following sum into one fused multiply-add
    # (one rounding where torch, op by op, has two); libdevice's _rn operations are never fused.
    if UNFUSED:
        return libdevice.mul_rn(a, b)
    else:
        return a * b


@triton.jit
def _add(a, b, UNFUSED: tl.constexpr):
    if UNFUSED:
        return libdevice.add_rn(a, b)
    else:
        return a + b


@triton.jit
def rotary_kernel(
    x_ptr, cos_ptr, sin_ptr, stride_xt, stride_xh, stride_cos, heads,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, UNFUSED: tl.constexpr,
):
    """In place: x[:rot] = x * cos + rotate_half(x) * sin for every head of token t, each product
    and the sum rounded to x's dtype as torch does (the channels past 2 * HALF are left alone).
    UNFUSED (compiled kernels; the interpreter computes op by op anyway): no fused multiply-add."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < heads) & (d < HALF)
    first = x_ptr + t * stride_xt + h * stride_xh + d
    x1 = tl.load(first, mask=mask, other=0.0)
    x2 = tl.load(first + HALF, mask=mask, other=0.0)
    c1 = tl.load(cos_ptr + t * stride_cos + d, mask=d < HALF, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + t * stride_cos + HALF + d, mask=d < HALF, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + t * stride_cos + d, mask=d < HALF, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + t * stride_cos + HALF + d, mask=d < HALF, other=0.0).to(tl.float32)
    dtype = x1.dtype
    a1 = _mul(x1.to(tl.float32), c1, UNFUSED).to(dtype)
    b1 = _mul(-x2.to(tl.float32), s1, UNFUSED).to(dtype)
    a2 = _mul(x2.to(tl.float32), c2, UNFUSED).to(dtype)
    b2 = _mul(x1.to(tl.float32), s2, UNFUSED).to(dtype)
    tl.store(first, _add(a1.to(tl.float32), b1.to(tl.float32), UNFUSED).to(dtype), mask=mask)
    tl.store(first + HALF, _add(a2.to(tl.float32), b2.to(tl.float32), UNFUSED).to(dtype), mask=mask)


@triton.jit
def silu_mul_kernel(gate_up_ptr, out_ptr, stride_in, stride_out, N, BLOCK: tl.constexpr):
    """out = to_dtype(silu(gate)) * up, gate and up the two halves of a row of gate_up."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * stride_in + N + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    out = (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)
    tl.store(out_ptr + row * stride_out + cols, out, mask=mask)
