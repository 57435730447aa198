"""Qwen3-Omni's thinker served as text in, text out: the worker loads the random Qwen3-Omni directory as
the one-node graph `thinker` (its mixture-of-experts text model from thinker_config.text_config and
thinker.model.* / thinker.lm_head.*), and requests of several lengths, staggered so prefill chunks mix
with decodes on small shuffled blocks, give exactly the greedy tokens of transformers' thinker.generate."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_omni_moe")

from qwen3_omni_fixtures import OMNI_MARKS, model_dir  # noqa: E402,F401  (fixtures)
from baton_worker.protocol import SamplingParams  # noqa: E402
from baton_worker.runtime.loading import load_worker  # noqa: E402
from baton_worker.runtime.options import WorkerOptions  # noqa: E402
from engine_sim import EngineSim, SimRequest  # noqa: E402

NEW_TOKENS = 12

pytestmark = OMNI_MARKS


def test_thinker_text_equals_transformers(model_dir):
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=96, dtype="float32")
    worker = load_worker(opts)
    nodes = worker.ready.graph["nodes"]
    assert [(n["name"], n["engine"]) for n in nodes] == [("thinker", "kv_cache")]
    assert worker.ready.architecture == "Qwen3OmniMoeForConditionalGeneration"
    assert worker.config.moe is not None and any(worker.config.moe.sparse_layers), "the thinker has expert layers"
    rng = random.Random(0)
    prompts = [[rng.randrange(151000) for _ in range(n)] for n in (1, 5, 13, 22)]
    sim = EngineSim(worker.runner, 4, 96, token_budget=8, seed=4)
    requests = [SimRequest(i, p, NEW_TOKENS, SamplingParams(temperature=0.0), arrive_step=2 * i) for i, p in enumerate(prompts)]
    sim.run(requests)
    thinker = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).thinker.eval()
    for request, prompt in zip(requests, prompts):
        with torch.no_grad():
            expected = thinker.generate(input_ids=torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(prompt):].tolist()
        assert request.output == expected
        assert len(set(expected)) >= NEW_TOKENS // 2, "the random thinker should vary its tokens"
