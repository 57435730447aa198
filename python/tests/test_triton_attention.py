"""The Triton attention kernels against the reference backend.

On a machine without a GPU they run in Triton's interpreter on CPU tensors
(conftest.py sets TRITON_INTERPRET=1); on a GPU the same tests run the
compiled kernels. Mixed steps (decodes, first prefill chunks, later chunks
over cached context, a prefix page shared by two rows), GQA groups 1 to 8 and
an odd one, block sizes 16 and 32, sliding windows, split-KV decodes whose
splits are merged, bfloat16, and the static decode inputs CUDA graphs replay.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from baton_worker.attention import ReferenceBackend  # noqa: E402
from baton_worker.attention.triton_attention import TritonBackend  # noqa: E402
from test_attention import attention_case  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _check(caches, meta, qkv, heads, window, head_dim, atol=1e-5, splits=None):
    q, k, v = qkv
    scale = head_dim**-0.5
    ref = ReferenceBackend(caches[0], heads, scale, [window])
    fast = TritonBackend(caches[1], heads, scale, [window])
    plan = fast.prepare(meta)
    if splits is not None:
        assert plan.decode is not None and plan.decode.splits == splits
    expected = ref.prepare(meta).run(0, q, k, v)
    got = plan.run(0, q, k, v)
    assert not got.isnan().any()
    torch.testing.assert_close(got, expected, atol=atol, rtol=atol)
    # Both wrote the new tokens' K/V to the same slots, and nothing else.
    assert torch.equal(caches[0].layers[0], caches[1].layers[0])


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("window", [None, 5, 40])
def test_mixed_step_matches_reference(block_size, group, window):
    seed = block_size + group + (window or 0)
    caches, meta, qkv, _ = attention_case(seed, block_size, group, 8, 96, device=DEVICE)
    _check(caches, meta, qkv, 2 * group, window, 16)


@pytest.mark.parametrize("head_dim,group,kv_heads", [(64, 4, 2), (128, 8, 1), (80, 3, 2)])
def test_head_shapes(head_dim, group, kv_heads):
    """Real head sizes, and a head size and group that are not powers of two."""
    caches, meta, qkv, _ = attention_case(9, 16, group, 5, 64, head_dim=head_dim, kv_heads=kv_heads, device=DEVICE)
    _check(caches, meta, qkv, kv_heads * group, None, head_dim, atol=1e-4)


def test_long_prefill_chunk_spans_tiles():
    """A chunk of many queries over a cached prefix: several query tiles per row, several key tiles each."""
    rows = [(70, 90), (0, 130), (40, 1)]
    caches, meta, qkv, _ = attention_case(4, 16, 4, len(rows), 64, rows=rows, device=DEVICE)
    _check(caches, meta, qkv, 8, None, 16)
    caches, meta, qkv, _ = attention_case(4, 16, 4, len(rows), 64, rows=rows, device=DEVICE)
    _check(caches, meta, qkv, 8, 33, 16)


@pytest.mark.parametrize("window", [None, 300])
def test_split_kv_decode_merges_splits(window):
    """Long decode contexts split over several programs, merged by the second kernel;
    a window that leaves the first splits' keys out."""
    rows = [(1000, 1), (700, 1)]
    caches, meta, qkv, _ = attention_case(2, 16, 4, len(rows), 160, rows=rows, device=DEVICE)
    backend = TritonBackend(caches[1], 8, 0.25, [window])
    splits = backend.decode_splits(len(rows), 1001)
    assert splits > 1
    _check(caches, meta, qkv, 8, window, 16, splits=splits)


def test_short_contexts_leave_splits_empty():
    """Graph plans fix the split count without knowing lengths: empty splits weigh nothing."""
    rows = [(3, 1), (0, 1), (20, 1)]
    caches, meta, (q, k, v), _ = attention_case(6, 16, 4, len(rows), 16, rows=rows, device=DEVICE)
    ref = ReferenceBackend(caches[0], 8, 0.25, [None])
    fast = TritonBackend(caches[1], 8, 0.25, [None])
    seq_lens = torch.as_tensor(meta.seq_lens, dtype=torch.int32, device=DEVICE)
    q_index = torch.arange(len(rows), device=DEVICE)
    plan = fast.decode_plan(meta.slot_mapping, q_index, seq_lens, meta.block_table)
    plan.decode.splits = 8
    torch.testing.assert_close(plan.run(0, q, k, v), ref.prepare(meta).run(0, q, k, v), atol=1e-5, rtol=1e-5)


# Triton's interpreter mishandles bfloat16 (garbage from its dots), so on CPU the 16-bit path is checked in float16.
HALF = [torch.bfloat16, torch.float16] if DEVICE == "cuda" else [torch.float16]


@pytest.mark.parametrize("dtype", HALF)
def test_16_bit_close_to_reference(dtype):
    caches, meta, (q, k, v), _ = attention_case(5, 16, 4, 8, 96, dtype=dtype, device=DEVICE)
    ref = ReferenceBackend(caches[0], 8, 0.25, [None])
    fast = TritonBackend(caches[1], 8, 0.25, [None])
    expected = ref.prepare(meta).run(0, q, k, v).float()
    got = fast.prepare(meta).run(0, q, k, v).float()
    assert (got - expected).norm() / expected.norm() < 1e-2
