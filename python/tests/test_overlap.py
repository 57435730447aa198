"""Overlapped steps: step N+1 launched before step N is finished (the GPU
worker's way of keeping the device busy), driven as the engine's overlap mode
schedules. On CPU compute is synchronous, but the bookkeeping is the same:
reserved token places, inputs read from the device copy of the last sampled
tokens, results finished in order, and the steps that must not overlap."""

from __future__ import annotations

import random

import numpy as np
import pytest

from baton_worker.runtime.loading import load_worker
from baton_worker.runtime.options import WorkerOptions
from baton_worker.protocol import SamplingParams
from engine_sim import EngineSim, SimRequest
from hf_reference import hf_greedy
from random_models import make_model_dir

NEW_TOKENS = 12


def _prompts(vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in (1, 6, 14, 21)]


def _run(model_dir, samplings, prompts, overlap: bool, attention_backend="auto"):
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=96, dtype="float32",
                         attention_backend=attention_backend, seed=5)
    runner = load_worker(opts).runner
    runner.overlap = overlap
    sim = EngineSim(runner, 4, 96, token_budget=9, seed=3, overlap=overlap)
    requests = [SimRequest(i, p, NEW_TOKENS, s, arrive_step=2 * i) for i, (p, s) in enumerate(zip(prompts, samplings))]
    sim.run(requests)
    return requests, sim


@pytest.mark.parametrize("arch,backend", [("qwen3", "auto"), ("llama3", "auto"), ("mistral", "triton")])
def test_overlapped_greedy_matches_transformers(tmp_path, arch, backend):
    if backend == "triton":
        pytest.importorskip("triton")
    model_dir = make_model_dir(arch, tmp_path / arch, 2 if arch == "llama3" else 0)
    prompts = _prompts(512, 3)
    greedy = [SamplingParams(temperature=0.0)] * len(prompts)
    requests, sim = _run(model_dir, greedy, prompts, overlap=True, attention_backend=backend)
    assert [r.output for r in requests] == hf_greedy(model_dir, prompts, NEW_TOKENS)
    # Most steps went in while the previous one was still outstanding.
    assert sim.overlapped >= NEW_TOKENS


def test_overlap_changes_no_sampled_token(tmp_path):
    """Seeded draws, top-k/top-p, logprobs, a penalised request (its steps wait
    for the previous one) and an unseeded greedy one: the same tokens and
    logprobs with and without overlap."""
    model_dir = make_model_dir("qwen3", tmp_path / "m", 0)
    prompts = _prompts(512, 8)
    samplings = [
        SamplingParams(temperature=1.0, seed=11, logprobs=3),
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=12, logprobs=0),
        SamplingParams(temperature=1.0, seed=13, repetition_penalty=1.3, frequency_penalty=0.5),
        SamplingParams(temperature=0.0, logprobs=2),
    ]
    plain, _ = _run(model_dir, samplings, prompts, overlap=False)
    overlapped, sim = _run(model_dir, samplings, prompts, overlap=True)
    assert sim.overlapped > 0
    for a, b in zip(plain, overlapped):
        assert a.output == b.output
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-5, atol=1e-5)
        assert [ids for ids, _ in a.tops] == [ids for ids, _ in b.tops]
    assert len({t for r in plain for t in r.output}) > NEW_TOKENS  # varied draws, or equality proves little


def test_penalised_and_masked_steps_do_not_overlap(tmp_path):
    model_dir = make_model_dir("qwen3", tmp_path / "m", 0)
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=32, dtype="float32")
    runner = load_worker(opts).runner
    runner.overlap = True
    sim = EngineSim(runner, 4, 32, overlap=True)
    requests = [SimRequest(0, [5, 6, 7], 6, SamplingParams(temperature=1.0, seed=1, presence_penalty=0.5))]
    sim.run(requests)
    assert sim.overlapped == 0 and len(requests[0].output) == 6
