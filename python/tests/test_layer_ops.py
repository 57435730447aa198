"""The layer's Triton kernels (layer_kernels.py, the CUDA path) against the
torch operations they replace (layer_ops.TorchOps, transformers' arithmetic).
On CPU they run in Triton's interpreter (float32 and float16: the interpreter
mishandles bfloat16); on a GPU the compiled kernels, bfloat16 too."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from baton_worker.model.layer_ops import TorchOps, TritonOps  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    else:  # one unit in the last place: a sum in another order may round the other way
        torch.testing.assert_close(got.float(), want.float(), atol=0, rtol=2 ** -7 if dtype == torch.bfloat16 else 2 ** -10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [64, 200])
def test_rms_norm_and_add_rms_norm(dtype, width):
    gen = torch.Generator().manual_seed(width)
    x = (torch.randn(7, width, generator=gen) * 3).to(DEVICE, dtype)
    delta = torch.randn(7, width, generator=gen).to(DEVICE, dtype)
    weight = (torch.rand(width, generator=gen) + 0.5).to(DEVICE, dtype)
    torch_ops, triton_ops = TorchOps(1e-6), TritonOps(1e-6)
    _close(triton_ops.rms_norm(x, weight), torch_ops.rms_norm(x, weight), dtype)
    residual, normed = triton_ops.add_rms_norm(x, delta, weight)
    want_residual, want_normed = torch_ops.add_rms_norm(x, delta, weight)
    assert torch.equal(residual, want_residual)
    _close(normed, want_normed, dtype)


def test_per_head_norm_of_a_strided_view():
    """Qwen3's q/k norms: [tokens, heads, head_dim] views into the fused q/k/v output."""
    gen = torch.Generator().manual_seed(1)
    qkv = torch.randn(5, 6 * 16, generator=gen).to(DEVICE)
    q = qkv[:, : 4 * 16].view(5, 4, 16)
    weight = torch.rand(16, generator=gen).to(DEVICE) + 0.5
    _close(TritonOps(1e-6).rms_norm(q, weight), TorchOps(1e-6).rms_norm(q, weight), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,rotary_dim", [(32, 32), (64, 32)])
def test_rotary_in_place_on_a_strided_view(dtype, head_dim, rotary_dim):
    gen = torch.Generator().manual_seed(head_dim + rotary_dim)
    qkv = torch.randn(6, 5 * head_dim, generator=gen).to(DEVICE, dtype)
    angles = torch.rand(6, rotary_dim // 2, generator=gen) * 6
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(DEVICE, dtype), emb.sin().to(DEVICE, dtype)
    want = TorchOps(1e-6).rotary(qkv[:, : 3 * head_dim].view(6, 3, head_dim), cos, sin)
    untouched = qkv[:, 3 * head_dim :].clone()
    got = TritonOps(1e-6).rotary(qkv[:, : 3 * head_dim].view(6, 3, head_dim), cos, sin)
    assert torch.equal(got, want)  # every rounding where torch rounds
    assert torch.equal(qkv[:, 3 * head_dim :], untouched)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    gen = torch.Generator().manual_seed(3)
    gate_up = (torch.randn(5, 2 * 1500, generator=gen) * 4).to(DEVICE, dtype)
    _close(TritonOps(1e-6).silu_mul(gate_up), TorchOps(1e-6).silu_mul(gate_up), dtype)
