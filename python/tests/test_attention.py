"""Attention backends against the reference per-row SDPA loop, on random mixed
batches over a paged cache: prefill chunks at various start offsets, decodes,
sliding windows, GQA ratios 1, 4 and 8, block sizes 4 and 16, shuffled pages
and a prefix page shared by two rows."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from baton_worker.attention import AttentionMetadata, CpuBackend, FlexBackend, ReferenceBackend
from baton_worker.attention.kv_cache import KVCache

HEAD_DIM = 16
KV_HEADS = 2


def _rows(rng: np.random.Generator, n: int) -> list[tuple[int, int]]:
    """(tokens already cached, new tokens) per row: a mix of decodes and prefill chunks."""
    rows = []
    for _ in range(n):
        kind = rng.integers(3)
        if kind == 0:
            rows.append((int(rng.integers(0, 40)), 1))  # decode
        elif kind == 1:
            rows.append((0, int(rng.integers(2, 24))))  # first prefill chunk
        else:
            rows.append((int(rng.integers(1, 30)), int(rng.integers(2, 12))))  # later chunk
    return rows


def attention_case(seed: int, block_size: int, group: int, num_rows: int, num_blocks: int, dtype=torch.float32, rows=None,
          head_dim: int = HEAD_DIM, kv_heads: int = KV_HEADS, device: str = "cpu"):
    """Two identical caches holding every row's earlier context, and the step's metadata and new q/k/v."""
    rng = np.random.default_rng(seed)
    rows = rows or _rows(rng, num_rows)
    pages_needed = [-(-(s + n) // block_size) for s, n in rows]
    free = list(rng.permutation(num_blocks))
    tables = [[int(free.pop()) for _ in range(p)] for p in pages_needed]
    # Row 1 shares row 0's first page (a prefix-cache hit): same page, same index,
    # and since its context there was written by row 0 it must be identical tokens.
    shared = len(rows) > 1 and rows[0][0] >= block_size and rows[1][0] >= block_size
    if shared:
        free.append(tables[1][0])
        tables[1][0] = tables[0][0]
    config = SimpleNamespace(num_layers=1, num_kv_heads=kv_heads, head_dim=head_dim)
    caches = [KVCache(config, num_blocks, block_size, dtype, torch.device(device)) for _ in range(2)]
    gen = torch.Generator().manual_seed(seed)
    width = max(pages_needed)
    table = torch.zeros(len(rows), width, dtype=torch.int64)
    slot_mapping, query_start, seq_lens = [], [0], []
    for r, ((start, n), pages) in enumerate(zip(rows, tables)):
        table[r, : len(pages)] = torch.tensor(pages)
        slots = torch.tensor([pages[p // block_size] * block_size + p % block_size for p in range(start + n)])
        earlier = slots[:start]
        if shared and r == 1:
            earlier = earlier[block_size:]  # row 0 wrote the shared page
        k = torch.randn(len(earlier), kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(len(earlier), kv_heads, head_dim, generator=gen).to(dtype)
        for cache in caches:
            cache.write(0, earlier.to(device), k.to(device), v.to(device))
        slot_mapping.append(slots[start:])
        query_start.append(query_start[-1] + n)
        seq_lens.append(start + n)
    meta = AttentionMetadata(
        torch.cat(slot_mapping).to(device), np.array(query_start, np.int64), np.array(seq_lens, np.int64), table.to(device), block_size
    )
    t = query_start[-1]
    q = torch.randn(t, kv_heads * group, head_dim, generator=gen).to(dtype)
    k = torch.randn(t, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(t, kv_heads, head_dim, generator=gen).to(dtype)
    q, k, v = q.to(device), k.to(device), v.to(device)
    return caches, meta, (q, k, v), group


def _compare(backend_cls, seed, block_size, group, window, num_rows, num_blocks, **kwargs):
    caches, meta, (q, k, v), group = attention_case(seed, block_size, group, num_rows, num_blocks)
    scale = HEAD_DIM**-0.5
    ref = ReferenceBackend(caches[0], KV_HEADS * group, scale, [window])
    fast = backend_cls(caches[1], KV_HEADS * group, scale, [window], **kwargs)
    ref.prepare(meta)
    fast.prepare(meta)
    expected = ref.run(0, q, k, v)
    got = fast.run(0, q, k, v)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # Both wrote the new tokens' K/V to the same slots.
    assert torch.equal(caches[0].layers[0], caches[1].layers[0])


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("window", [None, 5, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cpu_backend_matches_reference(seed, block_size, group, window):
    _compare(CpuBackend, seed, block_size, group, window, num_rows=12, num_blocks=256)


@pytest.mark.parametrize("group", [1, 4])
def test_cpu_backend_decode_only_step(group):
    """Decodes whose contexts fall in one bucket (9..16 pages) take the path
    where the bucket's output is the step's output, with no scatter."""
    rows = [(s, 1) for s in (36, 40, 50, 63, 44, 37)]
    caches, meta, (q, k, v), _ = attention_case(7, 4, group, len(rows), 256, rows=rows)
    scale = HEAD_DIM**-0.5
    ref = ReferenceBackend(caches[0], KV_HEADS * group, scale, [None])
    fast = CpuBackend(caches[1], KV_HEADS * group, scale, [None])
    ref.prepare(meta)
    fast.prepare(meta)
    assert fast.direct
    torch.testing.assert_close(fast.run(0, q, k, v), ref.run(0, q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("window", [None, 5])
def test_flex_backend_matches_reference_in_eager_mode(block_size, group, window):
    """The CUDA backend's paging logic (block mask, page positions, mask_mod),
    run by eager flex_attention on CPU; compiled kernels need a GPU."""
    _compare(FlexBackend, 3, block_size, group, window, num_rows=6, num_blocks=48, compile=False)


def test_bfloat16_cpu_backend_close_to_reference():
    caches, meta, (q, k, v), group = attention_case(5, 16, 4, 10, 128, dtype=torch.bfloat16)
    scale = HEAD_DIM**-0.5
    ref = ReferenceBackend(caches[0], KV_HEADS * group, scale, [None])
    fast = CpuBackend(caches[1], KV_HEADS * group, scale, [None])
    ref.prepare(meta)
    fast.prepare(meta)
    torch.testing.assert_close(fast.run(0, q, k, v), ref.run(0, q, k, v), atol=2e-2, rtol=2e-2)
