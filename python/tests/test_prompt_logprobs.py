"""Prompt logprobs from the worker equal transformers' log-softmax of the same prompt.

Every architecture of random_models.py, float32, driven through StepRunner by
EngineSim with a small token budget, so prompts are split into chunks that
share steps with other requests' chunks and decodes (and with a request that
wants no prompt logprobs). Position p scores prompt token p + 1; the first
prompt token has none.
"""

from __future__ import annotations

import random

import pytest
import torch

from baton_worker.runtime.loading import load_worker
from baton_worker.runtime.options import WorkerOptions
from baton_worker.protocol import SamplingParams
from engine_sim import EngineSim, SimRequest
from hf_reference import load_model
from random_models import ARCHES, make_model_dir

TOLERANCE = 1e-4


def hf_prompt_logprobs(model, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, vocab]: row p is the log-softmax that scores prompt[p + 1]."""
    with torch.no_grad():
        ids = torch.tensor([prompt], dtype=torch.long)
        logits = model(ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1)


@pytest.mark.parametrize("arch", ARCHES)
def test_prompt_logprobs_match_transformers(tmp_path, arch, one_torch_thread):
    model_dir = make_model_dir(arch, tmp_path / arch, variant=0)
    rng = random.Random(arch)
    prompts = [[rng.randrange(512) for _ in range(n)] for n in (1, 2, 9, 23)]
    ks = [3, 0, 5, 2]
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=64, dtype="float32")
    runner = load_worker(opts).runner
    greedy = SamplingParams(temperature=0.0)
    requests = [SimRequest(i, p, 3, greedy, arrive_step=i, prompt_logprobs=k) for i, (p, k) in enumerate(zip(prompts, ks))]
    # A neighbour that wants none: its rows share the steps but add nothing.
    requests.append(SimRequest(9, prompts[3][::-1], 4, greedy, arrive_step=1))
    sim = EngineSim(runner, 4, 64, token_budget=5, seed=1)
    sim.run(requests)
    by_id = {r.req_id: r for r in requests}
    chunked = [n for st in sim.steps for i, n in zip(st.req_ids.tolist(), st.num_new_tokens.tolist()) if 1 < len(by_id[i].prompt) and n < len(by_id[i].prompt) and n > 1]
    assert chunked, "prompts should be split into chunks"
    assert requests[-1].prompt_results == []

    model = load_model(model_dir, "float32")
    compared = 0
    for r, k in zip(requests, ks):
        assert len(r.prompt_results) == len(r.prompt) - 1
        if len(r.prompt) < 2:
            continue
        ref = hf_prompt_logprobs(model, r.prompt)
        for p, (logprob, rank, top_ids, top_lps) in enumerate(r.prompt_results):
            target = r.prompt[p + 1]
            expected = float(ref[p, target])
            assert abs(logprob - expected) < TOLERANCE, (arch, r.req_id, p, logprob, expected)
            # Ties within the tolerance may order either way.
            close = int(((ref[p] - expected).abs() < TOLERANCE).sum())
            assert abs(rank - (int((ref[p] > expected).sum()) + 1)) < close, (arch, r.req_id, p, rank)
            values, ids = torch.topk(ref[p], k)
            assert len(top_ids) == k
            assert all(abs(a - float(b)) < TOLERANCE for a, b in zip(top_lps, values)), (arch, r.req_id, p)
            assert top_ids[:1] == ids[:1].tolist() or abs(float(values[0]) - float(values[1])) < TOLERANCE
            compared += 1
    assert compared == 1 + 8 + 22
