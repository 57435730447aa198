"""Qwen3-Omni's thinker text model with vision input, in the worker's decoder: image rows in place of the
image tokens' embeddings, the deepstack features added after the first layers at those positions, and
interleaved multimodal rotary positions give transformers' Qwen3OmniMoeThinkerTextModel's hidden states
to float rounding and its greedy tokens (one prompt through the paged cache in two chunks, as a prefill
cut by the scheduler)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_omni_moe")

from baton_worker.attention import AttentionMetadata, make_backend  # noqa: E402
from baton_worker.attention.kv_cache import KVCache  # noqa: E402
from qwen3_omni_fixtures import OMNI_MARKS, model_dir  # noqa: E402,F401  (fixtures)
from baton_worker.runtime.loading import load_worker  # noqa: E402
from baton_worker.runtime.options import WorkerOptions  # noqa: E402

BLOCK = 4

pytestmark = OMNI_MARKS


def test_image_rows_deepstack_and_interleaved_positions_equal_transformers(model_dir):
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=BLOCK, num_blocks=16, dtype="float32",
                         device="cpu")  # the test's tensors and transformers' run are on the CPU
    worker = load_worker(opts)
    model, config = worker.runner.model, worker.config
    assert config.rope.mrope_interleaved and config.rope.mrope_section
    thinker = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).thinker.eval()
    g = torch.Generator().manual_seed(3)
    t = 14
    ids = torch.randint(0, 150000, (t,), generator=g)
    image = torch.arange(3, 9)  # six image tokens: a 2 x 3 merged grid
    rows = torch.randn(len(image), config.hidden_size, generator=g)
    deepstack = [torch.randn(len(image), config.hidden_size, generator=g) for _ in range(2)]
    # Text counts on, the image takes (t, h, w) over its grid from the running position, text resumes after.
    positions = torch.zeros(3, t, dtype=torch.int64)
    positions[:, :3] = torch.arange(3)
    hh, ww = torch.meshgrid(torch.arange(2), torch.arange(3), indexing="ij")
    positions[:, 3:9] = torch.stack((torch.zeros(6, dtype=torch.int64), hh.reshape(-1), ww.reshape(-1))) + 3
    positions[:, 9:] = torch.arange(t - 9) + 6

    embeds = thinker.model.embed_tokens(ids[None]).detach().clone()
    embeds[0, image] = rows
    mask = torch.zeros(1, t, dtype=torch.bool)
    mask[0, image] = True
    with torch.no_grad():
        expected = thinker.model(inputs_embeds=embeds, position_ids=positions[:, None, :], visual_pos_masks=mask,
                                 deepstack_visual_embeds=deepstack).last_hidden_state[0]

    cache = KVCache(config, 16, BLOCK, torch.float32, torch.device("cpu"))
    backend = make_backend("cpu", cache, config.num_heads, model.scale, config.sliding_windows)
    table = torch.arange(4, dtype=torch.int64)[None]
    outs = []
    for start, end in ((0, 6), (6, t)):  # a chunk boundary through the image
        meta = AttentionMetadata(torch.arange(start, end), np.array([0, end - start]), np.array([end]), table, BLOCK)
        inside = image[(image >= start) & (image < end)]
        local = inside - start
        keep = (inside - image[0])
        hidden = model.hidden_states(ids[start:end], positions[:, start:end], backend.prepare(meta),
                                     replace=(local, rows[keep]), deepstack=(local, [d[keep] for d in deepstack]))
        outs.append(model.head_input(hidden, torch.arange(end - start)))
    got = torch.cat(outs)
    # The paged attention sums in another order than transformers' SDPA: rounding, and the same greedy tokens.
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    with torch.no_grad():
        assert torch.equal(model.lm_head(got).argmax(-1), thinker.lm_head(expected).argmax(-1))
    # The features matter: without the deepstack rows the image positions differ.
    meta = AttentionMetadata(torch.arange(0, t), np.array([0, t]), np.array([t]), table, BLOCK)
    plain = model.head_input(model.hidden_states(ids, positions, backend.prepare(meta), replace=(image, rows)), torch.arange(t))
    assert (plain[image] - expected[image]).abs().max() > 1e-2
