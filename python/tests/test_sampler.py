"""Sampling semantics (vLLM's): greedy, seeds, support restrictions, penalties, min_tokens, logprobs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from baton_worker.runtime.loading import load_worker
from baton_worker.runtime.options import WorkerOptions
from baton_worker.protocol import SamplingParams
from baton_worker.runtime.request_state import RequestState
from baton_worker.sampling.sampler import Sampler
from engine_sim import EngineSim, SimRequest
from random_models import make_model_dir

VOCAB = 16

# seeded_uniform(42, 0..2), pinned so a change of the rule is deliberate.
PINNED_UNIFORMS = [0.5961188673973083, 0.16036534309387207, 0.16639775037765503]


def state(req_id=0, tokens=(1, 2), prompt=None, **params) -> RequestState:
    tokens = list(tokens)
    return RequestState(req_id, tokens, len(tokens) if prompt is None else prompt, SamplingParams(**params))


def probs_logits(*probs) -> torch.Tensor:
    p = torch.full((VOCAB,), 1e-9)
    p[: len(probs)] = torch.tensor(probs)
    return torch.log(p / p.sum())


def penalised(sampler, logits, st) -> torch.Tensor:
    work = logits[None].clone()
    sampler.penalty_counts.apply(work, [st])
    return work[0]


def draws(sampler, logits, st, n=300) -> set[int]:
    return {int(sampler.sample(logits[None], [st]).token_ids[0]) for _ in range(n)}


def test_greedy_is_argmax():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    out = Sampler(0, torch.device("cpu")).sample(logits, [state(i, temperature=0.0) for i in range(3)])
    assert out.token_ids.tolist() == torch.argmax(logits, -1).tolist()
    assert out.logprobs is None and out.top_counts is None


def test_seeded_request_does_not_depend_on_batch():
    logits = torch.zeros(VOCAB)  # uniform: every draw is pure randomness
    sampler = Sampler(123, torch.device("cpu"))
    alone = state(0, temperature=1.0, seed=42)
    alone_tokens = []
    for _ in range(20):
        alone_tokens.append(int(sampler.sample(logits[None], [alone]).token_ids[0]))
        alone.token_ids.append(alone_tokens[-1])
    batched = state(0, temperature=1.0, seed=42)
    others = [state(1, temperature=1.0), state(2, temperature=1.0, seed=7)]
    batched_tokens = []
    for i in range(20):
        rows = [others[0], batched, others[1]] if i % 2 else [batched, others[0]]
        out = sampler.sample(logits.expand(len(rows), VOCAB).clone(), rows)
        for st, token in zip(rows, out.token_ids.tolist()):
            st.token_ids.append(token)
        batched_tokens.append(int(out.token_ids[rows.index(batched)]))
    assert alone_tokens == batched_tokens
    assert len(set(alone_tokens)) > 3  # really random


def test_seeded_draw_depends_on_seed_and_output_position_only():
    logits = torch.zeros(VOCAB)
    first = Sampler(1, torch.device("cpu"))
    st = state(0, tokens=(1, 2, 3), prompt=3, temperature=1.0, seed=42)
    tokens = []
    for _ in range(12):
        tokens.append(int(first.sample(logits[None], [st]).token_ids[0]))
        st.token_ids.append(tokens[-1])
    # Recomputed after preemption at output position 5, by another sampler: the same continuation.
    resumed = state(0, tokens=[1, 2, 3] + tokens[:5], prompt=3, temperature=1.0, seed=42)
    again = []
    for _ in range(7):
        again.append(int(Sampler(99, torch.device("cpu")).sample(logits[None], [resumed]).token_ids[0]))
        resumed.token_ids.append(again[-1])
    assert again == tokens[5:]
    other_seed = state(0, tokens=(1, 2, 3), prompt=3, temperature=1.0, seed=43)
    differ = []
    for _ in range(12):
        differ.append(int(first.sample(logits[None], [other_seed]).token_ids[0]))
        other_seed.token_ids.append(differ[-1])
    assert differ != tokens


def test_seeded_uniform_is_a_fixed_hash_of_seed_and_position():
    from baton_worker.sampling.sampler import seeded_uniform

    values = [seeded_uniform(seed, pos) for seed in (0, 1, -1, 7, 12345) for pos in range(200)]
    assert all(0.0 <= v < 1.0 and v * 2**24 == int(v * 2**24) for v in values)
    assert seeded_uniform(1, 7) == seeded_uniform(2**64 + 1, 7)  # seeds are taken modulo 2**64
    assert seeded_uniform(-1, 3) == seeded_uniform(2**64 - 1, 3)
    assert len(set(values)) > 990  # 1000 draws of 24 bits: collisions are rare
    assert abs(float(np.mean(values)) - 0.5) < 0.03
    # Pinned: a change of the rule changes every seeded request's output.
    assert [seeded_uniform(42, p) for p in range(3)] == PINNED_UNIFORMS


def test_unseeded_requests_follow_the_worker_seed():
    logits = torch.zeros(2, VOCAB)
    runs = []
    for _ in range(2):
        sampler = Sampler(5, torch.device("cpu"))
        rows = [state(0, temperature=1.0), state(1, temperature=1.0)]
        runs.append([sampler.sample(logits, rows).token_ids.tolist() for _ in range(5)])
    assert runs[0] == runs[1]


def test_top_k_restricts_support():
    sampler = Sampler(0, torch.device("cpu"))
    logits = torch.arange(VOCAB, dtype=torch.float32) * 0.1
    assert draws(sampler, logits, state(temperature=1.0, top_k=3)) == {13, 14, 15}


def test_top_p_restricts_support():
    sampler = Sampler(0, torch.device("cpu"))
    # Sorted ascending: 0.1, 0.1, 0.3, 0.5; cumulative 0.1, 0.2, 0.5, 1.0. With
    # top_p 0.7 the tail within 0.3 goes: {0.5, 0.3} remain.
    logits = probs_logits(0.5, 0.3, 0.1, 0.1)
    assert draws(sampler, logits, state(temperature=1.0, top_p=0.7)) == {0, 1}
    assert draws(sampler, logits, state(temperature=1.0, top_p=0.4)) == {0}


def test_min_p_restricts_support():
    sampler = Sampler(0, torch.device("cpu"))
    logits = probs_logits(0.5, 0.3, 0.1, 0.1)
    assert draws(sampler, logits, state(temperature=1.0, min_p=0.5)) == {0, 1}
    assert draws(sampler, logits, state(temperature=1.0, min_p=0.0)) == {0, 1, 2, 3}


def test_repetition_penalty_covers_prompt_and_output():
    sampler = Sampler(0, torch.device("cpu"))
    logits = torch.tensor([2.0, -1.0, 1.5, 0.5] + [-5.0] * (VOCAB - 4))
    st = state(tokens=[0, 1, 3], prompt=2, repetition_penalty=2.0)
    got = penalised(sampler, logits, st)
    # 0 and 1 from the prompt, 3 from the output: positive / 2, negative * 2.
    assert got[:4].tolist() == [1.0, -2.0, 1.5, 0.25]
    assert int(sampler.sample(logits[None], [state(tokens=[0, 1, 3], prompt=2, temperature=0.0, repetition_penalty=2.0)]).token_ids[0]) == 2


def test_frequency_and_presence_penalties_count_output_only():
    sampler = Sampler(0, torch.device("cpu"))
    logits = torch.zeros(VOCAB)
    st = state(tokens=[4, 5, 5, 5, 6], prompt=2, frequency_penalty=0.5, presence_penalty=1.0)
    got = penalised(sampler, logits, st)
    assert got[4] == 0.0  # prompt only
    assert got[5] == pytest.approx(-(0.5 * 2 + 1.0))  # prompt once, output twice
    assert got[6] == pytest.approx(-(0.5 * 1 + 1.0))
    # Counts stay right as the request grows between steps.
    st.token_ids.append(6)
    assert penalised(sampler, logits, st)[6] == pytest.approx(-(0.5 * 2 + 1.0))


def test_min_tokens_suppresses_until_reached():
    sampler = Sampler(0, torch.device("cpu"))
    logits = probs_logits(0.9, 0.1)
    params = dict(temperature=0.0, min_tokens=2, suppress_token_ids=np.array([0], np.int32))
    st = state(tokens=[7, 8], prompt=2, **params)
    assert int(sampler.sample(logits[None], [st]).token_ids[0]) == 1
    st.token_ids += [1, 1]  # two outputs: min_tokens reached
    assert int(sampler.sample(logits[None], [st]).token_ids[0]) == 0


def test_logprobs_are_raw_distribution_with_top_n():
    sampler = Sampler(0, torch.device("cpu"))
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    rows = [
        state(0, temperature=0.0, logprobs=0, repetition_penalty=3.0),
        state(1, temperature=0.0, logprobs=-1),
        state(2, temperature=0.0, logprobs=3),
    ]
    out = sampler.sample(logits, rows)
    raw = torch.log_softmax(logits, -1)
    for i, token in enumerate(out.token_ids):
        assert out.logprobs[i] == pytest.approx(float(raw[i, token]), abs=1e-6)
    assert out.top_counts.tolist() == [0, 0, 3]
    values, ids = torch.topk(raw[2], 3)
    assert out.top_ids.tolist() == ids.tolist()
    assert out.top_logprobs.tolist() == pytest.approx(values.tolist(), abs=1e-6)
    assert all(math.isfinite(v) for v in out.logprobs)


def test_seeded_sampling_through_steps_is_batch_independent(tmp_path):
    model_dir = make_model_dir("qwen3", tmp_path / "m", variant=0)
    hot = SamplingParams(temperature=50.0, seed=1234, logprobs=2)

    def run(extra: int):
        loaded = load_worker(WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=64, seed=9))
        sim = EngineSim(loaded.runner, 4, 64, token_budget=6, seed=extra)
        target = SimRequest(100, [5, 6, 7, 8, 9], 12, hot, arrive_step=extra)
        others = [SimRequest(i, [i + 1] * (3 + i), 10, SamplingParams(temperature=50.0), arrive_step=0) for i in range(extra)]
        sim.run(others + [target])
        return target

    alone, crowded = run(0), run(3)
    assert alone.output == crowded.output
    assert len(set(alone.output)) > 6
    assert alone.logprobs == pytest.approx(crowded.logprobs, abs=1e-4)
    assert [len(t[0]) for t in alone.tops] == [2] * 12


def test_draws_follow_the_distribution():
    sampler = Sampler(0, torch.device("cpu"))
    logits = probs_logits(0.5, 0.3, 0.2)
    st = state(temperature=1.0)
    counts = np.bincount([int(sampler.sample(logits[None], [st]).token_ids[0]) for _ in range(3000)], minlength=3)
    assert counts[:3] / 3000 == pytest.approx([0.5, 0.3, 0.2], abs=0.04)


def test_top_k_then_top_p_renormalise_within_top_k():
    sampler = Sampler(0, torch.device("cpu"))
    # top_k 2 leaves {0.4, 0.3} -> renormalised 0.571, 0.429; top_p 0.5 keeps only the first.
    logits = probs_logits(0.4, 0.3, 0.2, 0.1)
    assert draws(sampler, logits, state(temperature=1.0, top_k=2, top_p=0.5)) == {0}
    assert draws(sampler, logits, state(temperature=1.0, top_k=2, top_p=0.6)) == {0, 1}


@pytest.mark.parametrize("vocab", [16, 2049, 3000, 4096, 151936])
def test_blocked_argmax_is_torch_argmax(vocab):
    from baton_worker.sampling.sampler import first_argmax

    gen = torch.Generator().manual_seed(vocab)
    # bf16-rounded logits tie often; ties across and inside blocks, -inf rows and a NaN row.
    x = (torch.randn(40, vocab, generator=gen) * 2).to(torch.bfloat16).float()
    x[1] = 1.0
    x[2, -1] = 100.0
    x[3, [5, vocab - 1]] = 100.0
    x[4, [vocab - 2, vocab - 1]] = 100.0
    x[5] = float("-inf")
    x[6, vocab // 2] = float("nan")
    assert torch.equal(first_argmax(x), torch.argmax(x, dim=-1))
    assert torch.equal(first_argmax(x[7:9]), torch.argmax(x[7:9], dim=-1))


@pytest.mark.parametrize("vocab", [16, 1024, 1500, 151936])
def test_inverse_cdf_draws_only_tokens_with_weight_and_spans_the_mass(vocab):
    from baton_worker.sampling.sampler import VOCAB_BLOCK, inverse_cdf

    gen = torch.Generator().manual_seed(vocab)
    weights = torch.rand(6, vocab, generator=gen)
    weights[weights < 0.9] = 0.0  # holes everywhere
    weights[0, :-1], weights[0, -1] = 0.0, 0.5  # only the last token
    weights[1, 1:], weights[1, 0] = 0.0, 0.5  # only the first token
    weights[2, : max(vocab - VOCAB_BLOCK // 2, 0)] = 0.0  # mass only in the last (possibly partial) block
    weights[2, -3] = 0.7
    # u at the edges: 0, a half and the largest float32 below 1; and 1.0 itself.
    for u in (0.0, 0.5, 1 - 2**-24, 1.0):
        picked = inverse_cdf(weights, torch.full((6, 1), u))
        assert (weights.gather(1, picked[:, None]) > 0).all(), u
    assert inverse_cdf(weights[:2], torch.full((2, 1), 0.999)).tolist() == [vocab - 1, 0]
    # The draw is u's quantile: u = 0 gives the first token with weight, u -> 1 the last.
    first = (weights > 0).int().argmax(-1)
    last = vocab - 1 - (weights > 0).int().flip(-1).argmax(-1)
    assert torch.equal(inverse_cdf(weights, torch.zeros(6, 1)), first)
    assert torch.equal(inverse_cdf(weights, torch.full((6, 1), 1 - 2**-24)), last)
