"""StepRunner bookkeeping: empty steps, preemption and resume, and inconsistent steps named by field."""

from __future__ import annotations

import numpy as np
import pytest

from baton_worker.runtime.loading import load_worker
from baton_worker.runtime.options import WorkerOptions
from baton_worker.protocol import AddedRequest, ProtocolError, SamplingParams, Step
from engine_sim import EngineSim, SimRequest
from hf_reference import hf_greedy
from random_models import make_model_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir("qwen2", tmp_path_factory.mktemp("m") / "qwen2", variant=0)


def runner(model_dir, num_blocks=32):
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=num_blocks)
    return load_worker(opts).runner


def i32(*v):
    return np.array(v, np.int32)


def step(step_id=0, added=(), removed=(), rows=(), blocks=()):
    """rows: (req_id, num_new, num_computed, new_block_count, sample)."""
    cols = list(zip(*rows)) or [(), (), (), (), ()]
    return Step(step_id, list(added), i32(*removed), i32(*cols[0]), i32(*cols[1]), i32(*cols[2]), i32(*cols[3]),
                i32(*blocks), np.array(cols[4], np.uint8))


def greedy_request(req_id, tokens, num_prompt=None):
    tokens = i32(*tokens)
    return AddedRequest(req_id, tokens, len(tokens) if num_prompt is None else num_prompt, SamplingParams(temperature=0.0))


def test_empty_step_and_prefill_without_sampling(model_dir):
    r = runner(model_dir)
    assert len(r.execute(step()).token_ids) == 0
    # A first chunk that does not reach the end of the prompt samples nothing.
    result = r.execute(step(1, [greedy_request(1, [1, 2, 3, 4, 5, 6])], rows=[(1, 4, 0, 1, 0)], blocks=[9]))
    assert len(result.req_ids) == 0 and result.logprobs is None
    result = r.execute(step(2, rows=[(1, 2, 4, 1, 1)], blocks=[3]))
    assert result.req_ids.tolist() == [1]


def test_preempted_request_resumes_with_same_greedy_output(model_dir):
    prompt = [7, 70, 170, 270, 370, 3]
    expected = hf_greedy(model_dir, [prompt], 12)[0]
    # Run 5 tokens, preempt (removed), re-add prompt + outputs as a new request, finish.
    first = SimRequest(1, prompt, 5, SamplingParams(temperature=0.0))
    r = runner(model_dir)
    EngineSim(r, 4, 32, token_budget=4).run([first])
    resumed = SimRequest(2, prompt + first.output, 7, SamplingParams(temperature=0.0))
    sim = EngineSim(r, 4, 32, token_budget=5, seed=3)
    sim.pending_removals = [1]
    sim.run([resumed])
    assert first.output + resumed.output == expected


@pytest.mark.parametrize(
    "build,error",
    [
        (lambda: [step(0, rows=[(5, 1, 0, 0, 1)])], r"^Step\.req_ids\[0\]: unknown request 5"),
        (lambda: [step(0, [greedy_request(1, [1, 2, 3, 4, 5])], rows=[(1, 5, 0, 1, 1)], blocks=[0])],
         r"^Step\.new_block_counts\[0\]: request 1 needs 2 blocks for 5 tokens, has 1"),
        (lambda: [step(0, [greedy_request(1, [1, 2])], rows=[(1, 2, 0, 1, 1)], blocks=[32])],
         r"^Step\.new_block_ids: block id outside \[0, 32\)"),
        (lambda: [step(0, [greedy_request(1, [1, 2, 3])], rows=[(1, 2, 0, 1, 1)], blocks=[0])],
         r"^Step\.sample\[0\]: row ends at position 2 but request 1 has 3 tokens"),
        (lambda: [step(0, [greedy_request(1, [1])]), step(1, [greedy_request(1, [1])])],
         r"^Step\.added\[0\]\.req_id: request 1 is already running"),
        (lambda: [step(0, [greedy_request(1, [1, 512])])], r"^Step\.added\[0\]\.token_ids\[1\]: 512 is outside the vocabulary"),
        (lambda: [step(0, [greedy_request(1, [1, 2], num_prompt=3)])], r"^Step\.added\[0\]\.num_prompt_tokens: 3 is outside"),
        (lambda: [Step(0, [], i32(), i32(1), i32(1, 2), i32(0), i32(0), i32(), np.zeros(1, np.uint8))],
         r"^Step\.num_new_tokens: has 2 entries, req_ids has 1"),
        (lambda: [step(0, [greedy_request(1, [1, 2])], rows=[(1, 2, 0, 1, 1)], blocks=[0, 1])],
         r"^Step\.new_block_ids: has 2 ids, new_block_counts sum to 1"),
        (lambda: [step(0, [greedy_request(1, [1, 2])], rows=[(1, 3, 0, 1, 1)], blocks=[0])],
         r"^Step\.num_new_tokens\[0\]: row runs to position 3 but request 1 has 2 tokens"),
    ],
)
def test_inconsistent_steps_name_the_field(model_dir, build, error):
    r = runner(model_dir)
    steps = build()
    for s in steps[:-1]:
        r.execute(s)
    with pytest.raises(ProtocolError, match=error):
        r.execute(steps[-1])


def test_persistent_batch_reuses_slots_and_resumes_the_same_id(model_dir):
    """Remove a request mid-generation and re-add it under the same id in the
    same step (preemption by recomputation): its slot is reused with fresh
    columns, and greedy output continues exactly as transformers'."""
    prompt = [5, 50, 150, 250, 350]
    other = [9, 90, 190]
    expected = hf_greedy(model_dir, [prompt, other], 10)
    r = runner(model_dir, num_blocks=64)
    first = SimRequest(1, prompt, 6, SamplingParams(temperature=0.0))
    neighbour = SimRequest(2, other, 3, SamplingParams(temperature=0.0))
    sim = EngineSim(r, 4, 64, token_budget=6)
    sim.run([first, neighbour])
    assert neighbour.output == expected[1][:3]
    # The neighbour's removal went out; request 1's is still pending.
    assert list(r.requests) == [1]
    slot = r.requests[1].slot
    # A new request takes the neighbour's freed slot, not request 1's.
    r.execute(step(100, [greedy_request(3, [1, 2, 3])], rows=[(3, 3, 0, 1, 0)], blocks=[60]))
    assert r.requests[3].slot != slot
    # Request 1 comes back (removed and re-added in one step) with prompt + outputs to recompute.
    resumed = SimRequest(1, prompt + first.output, 4, SamplingParams(temperature=0.0))
    sim2 = EngineSim(r, 4, 60, token_budget=4, seed=5)
    sim2.pending_removals = [1]
    sim2.run([resumed])
    assert first.output + resumed.output == expected[0]
    assert r.requests[1].slot == slot
    state = r.requests[3]
    # Columns of the request still held: its tokens, length and table.
    assert r.batch.lengths[state.slot] == 3 and r.batch.num_pages[state.slot] == 1
    assert r.batch.tokens[state.slot, :3].tolist() == [1, 2, 3] and r.batch.block_table[state.slot, 0] == 60


def test_reference_and_cpu_attention_give_the_same_tokens(model_dir):
    prompts = [[7, 8, 9, 10, 11, 12, 13], [100, 200], [300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310]]
    outputs = {}
    for backend in ("reference", "cpu"):
        opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=64)
        loaded = load_worker(opts, attention_backend=backend)
        requests = [SimRequest(i, p, 8, SamplingParams(temperature=0.0), arrive_step=i) for i, p in enumerate(prompts)]
        EngineSim(loaded.runner, 4, 64, token_budget=5).run(requests)
        outputs[backend] = [q.output for q in requests]
    assert outputs["reference"] == outputs["cpu"]


def test_seeded_requests_give_the_same_tokens_with_and_without_preemption(model_dir):
    """A seeded request's draw at output position i depends only on (seed, i):
    recomputed after preemption (its state dropped and re-added with its
    outputs so far), with other batch-mates and another worker seed, it
    continues exactly as the undisturbed run."""
    prompts = [[7, 70, 170, 270, 370, 3], [11, 12, 13], [400, 401, 402, 403, 404, 405, 406, 407, 408]]
    seeded = [
        SamplingParams(temperature=1.0, seed=1234),
        SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=-5),
        SamplingParams(temperature=1.3, min_p=0.02, seed=2**63 + 17, repetition_penalty=1.1),
    ]

    def run(preempt_at: dict[int, list[int]], mates: int, worker_seed: int) -> list[list[int]]:
        opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=64, seed=worker_seed)
        sim = EngineSim(load_worker(opts).runner, 4, 64, token_budget=9, seed=worker_seed)
        reqs = [SimRequest(i, p, 16, params) for i, (p, params) in enumerate(zip(prompts, seeded))]
        reqs += [SimRequest(10 + j, [20 + j, 30, 40], 16, SamplingParams(temperature=1.0), arrive_step=j) for j in range(mates)]
        for q in reqs:
            q.tokens = list(q.prompt)
        while not all(q.done for q in reqs):
            sim.step(reqs)
            for i in preempt_at.get(sim.step_id, []):
                if not reqs[i].done:
                    sim.preempt(reqs[i])
            assert sim.step_id < 500
        return [q.output for q in reqs[: len(prompts)]]

    undisturbed = run({}, mates=0, worker_seed=0)
    preempted = run({4: [0], 7: [1, 2], 12: [0, 2], 15: [1]}, mates=3, worker_seed=9)
    assert preempted == undisturbed
    assert all(len(set(out)) > 4 for out in undisturbed)  # really sampled


def test_the_head_screen_changes_no_deterministic_token_in_mixed_batches(model_dir):
    """Plain greedy and sampled rows are decided by the head's screen; rows with
    logprobs, penalties, a seed or top-k share their steps and take the exact
    path. Greedy and seeded tokens, and the logprobs asked for, are the same as
    with the screen off."""
    prompts = [[7, 8, 9, 10, 11, 12, 13], [100, 200], [300, 301, 302, 303, 304], [5, 6], [50, 60, 70], [1, 2, 3, 4], [90, 91]]
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logprobs=3),
        SamplingParams(temperature=0.0, presence_penalty=0.5),
        SamplingParams(temperature=1.0, seed=77, top_k=20),
        SamplingParams(temperature=1.0),  # screened, drawn: its tokens are not compared
        SamplingParams(temperature=0.7),
    ]
    results = {}
    for screen_on in (True, False):
        r = runner(model_dir, num_blocks=64)
        screen = r.model.lm_head.screen
        if screen is None:
            pytest.skip("no head screen on this CPU (it needs AVX512-BF16 or AMX)")
        decided = []
        if screen_on:
            sample = screen.sample
            screen.sample = lambda x, temps, g, shares=1: decided.append(len(temps)) or sample(x, temps, g, shares)
        else:
            r.model.lm_head.screen = None
        requests = [SimRequest(i, p, 10, s, arrive_step=i % 3) for i, (p, s) in enumerate(zip(prompts, params))]
        EngineSim(r, 4, 64, token_budget=7).run(requests)
        # Logprobs only where asked for (the engine reads no others).
        results[screen_on] = ([q.output for i, q in enumerate(requests) if i not in (5, 6)], requests[2].logprobs, requests[2].tops)
        if screen_on:
            assert sum(decided) >= 4 * 10  # the plain rows went through the screen
    (tokens, logprobs, tops), (tokens_off, logprobs_off, tops_off) = results[True], results[False]
    assert tokens == tokens_off
    # The exact path's head runs on fewer rows with the screen on (one row takes the
    # GEMV path), so logprobs may differ in the last bits.
    assert logprobs == pytest.approx(logprobs_off, abs=1e-5)
    assert [ids for ids, _ in tops] == [ids for ids, _ in tops_off]
