"""The grouped mixture-of-experts path (bfloat16 on a GPU: one grouped matrix multiply per projection, no host
read) gives the looped path's outputs: to float32 rounding in float32 on the CPU, and to bfloat16 rounding in
bfloat16, on the CPU and (where there is one) on the GPU, which bench/gpu/run.sh's moe part runs."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from baton_worker.model import decoder
from baton_worker.model.config import MoeConfig
from baton_worker.model.decoder import DecoderModel, MoeWeights

pytestmark = pytest.mark.skipif(decoder._GROUPED_MM is None, reason="this torch has no grouped matrix multiply")


def _case(dtype: torch.dtype, tokens: int, device: str = "cpu", experts: int = 8, top_k: int = 2, hidden: int = 32, inter: int = 16):
    g = torch.Generator().manual_seed(tokens)
    config = MoeConfig(num_experts=experts, top_k=top_k, intermediate_size=inter, norm_topk_prob=True, sparse_layers=(True,))
    moe = MoeWeights(router=torch.randn(experts, hidden, generator=g).to(dtype),
                     gate_up=torch.randn(experts, 2 * inter, hidden, generator=g).to(dtype) / hidden**0.5,
                     down=torch.randn(experts, hidden, inter, generator=g).to(dtype) / inter**0.5, config=config)
    h = torch.randn(tokens, hidden, generator=g).to(dtype)
    moe = MoeWeights(router=moe.router.to(device), gate_up=moe.gate_up.to(device), down=moe.down.to(device), config=config)
    h = h.to(device)
    # The methods need only the model's ops (silu_mul): a stand-in object with torch's.
    model = types.SimpleNamespace(ops=types.SimpleNamespace(silu_mul=lambda x: F.silu(x[..., : x.shape[-1] // 2]) * x[..., x.shape[-1] // 2 :]))
    logits = F.linear(h, moe.router)
    weights, chosen = torch.topk(F.softmax(logits, dim=-1, dtype=torch.float32), top_k, dim=-1)
    weights = (weights / weights.sum(-1, keepdim=True)).to(dtype).reshape(-1)
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    looped = DecoderModel._experts_looped(model, moe, h, flat, order, weights)
    grouped = DecoderModel._experts_grouped(model, moe, h, flat, order, weights)
    return looped, grouped


@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_grouped_equals_looped(tokens):
    looped, grouped = _case(torch.float32, tokens)
    torch.testing.assert_close(grouped, looped, rtol=1e-5, atol=1e-5)
    looped, grouped = _case(torch.bfloat16, tokens)
    torch.testing.assert_close(grouped.float(), looped.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("tokens", [1, 8, 300])
def test_grouped_equals_looped_on_the_gpu(tokens):
    looped, grouped = _case(torch.bfloat16, tokens, "cuda", experts=128, top_k=8, hidden=256, inter=96)
    torch.testing.assert_close(grouped.float(), looped.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(grouped, _case(torch.bfloat16, tokens, "cuda", experts=128, top_k=8, hidden=256, inter=96)[1]), "repeatable"
