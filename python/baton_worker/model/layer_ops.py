"""The decoder layer's small operations, behind one interface: TorchOps
(transformers' arithmetic in plain torch; the CPU path) and TritonOps (the
same arithmetic in one Triton launch each, layer_kernels.py; the CUDA path).

    rms_norm(x, weight)            -> normed
    add_rms_norm(x, delta, weight) -> (x + delta, normed(x + delta))
    rotary(x, cos, sin)            -> x rotated (TritonOps: in place)
    silu_mul(gate_up)              -> silu(gate) * up, gate and up the halves of the last dim
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..triton_interpreter import interpreted


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same arithmetic as HF's RMSNorm: normalise in float32, cast back, then scale.
    dtype = x.dtype
    if dtype == torch.float32 and weight.dtype == torch.float32:
        # torch's own op computes exactly this in float32 (the same bits), in one call instead of seven.
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class TorchOps:
    name = "torch"

    def __init__(self, eps: float):
        self.eps = eps

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.eps)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + delta
        return x, rms_norm(x, weight, self.eps)

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [T, heads, head_dim]; cos, sin: [T, rotary_dim]; rotates the first rotary_dim channels."""
        cos, sin = cos[:, None, :], sin[:, None, :]
        rotary_dim = cos.shape[-1]
        if rotary_dim == x.shape[-1]:
            return x * cos + rotate_half(x) * sin
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


def _pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


class TritonOps(TorchOps):
    name = "triton"

    def __init__(self, eps: float):
        super().__init__(eps)
        from . import layer_kernels

        self.kernels = layer_kernels
        self.unfused = not interpreted()  # compiled kernels: no fused multiply-add where torch rounds twice

    def _norm(self, x, delta, weight):
        """x: [rows, n] or [tokens, heads, n] with unit stride on n."""
        n = x.shape[-1]
        heads = x.shape[1] if x.dim() == 3 else 1
        rows = x.shape[0] * heads
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        residual = torch.empty_like(out) if delta is not None else out
        if rows:
            self.kernels.rms_norm_kernel[(rows,)](
                x, delta if delta is not None else x, residual, weight, out, self.eps,
                x.stride(0), x.stride(1) if heads > 1 else 0, delta.stride(0) if delta is not None else 0,
                residual.stride(0), out.stride(0) if heads == 1 else n, n,
                HEADS=heads, ADD=delta is not None, BLOCK=_pow2(n), num_warps=4 if n <= 4096 else 8,
            )
        return residual, out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.stride(-1) != 1 or x.dim() > 3:
            return super().rms_norm(x, weight)
        return self._norm(x, None, weight)[1]

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() != 2 or x.stride(-1) != 1 or delta.stride(-1) != 1:
            return super().add_rms_norm(x, delta, weight)
        return self._norm(x, delta, weight)

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.stride(-1) != 1 or not cos.is_contiguous() or not sin.is_contiguous():
            return super().rotary(x, cos, sin)
        t, heads, _ = x.shape
        half = cos.shape[-1] // 2
        if t:
            self.kernels.rotary_kernel[(t,)](
                x, cos, sin, x.stride(0), x.stride(1), cos.stride(0), heads,
                HALF=half, BLOCK_H=_pow2(heads), BLOCK_D=_pow2(half), UNFUSED=self.unfused,
            )
        return x

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if gate_up.dim() != 2 or gate_up.stride(-1) != 1:
            return super().silu_mul(gate_up)
        rows, width = gate_up.shape
        n = width // 2
        out = torch.empty(rows, n, dtype=gate_up.dtype, device=gate_up.device)
        block = 1024
        if rows:
            self.kernels.silu_mul_kernel[(rows, -(-n // block))](gate_up, out, gate_up.stride(0), out.stride(0), n, BLOCK=block)
        return out
