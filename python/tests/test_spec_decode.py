"""Speculative decoding in the worker: the n-gram proposer (spec/ngram.py) and
greedy verification of Step.spec drafts (step_runner.py).

The parity tests drive a real StepRunner through EngineSim with draft
scheduling on (spec_tokens): greedy output with drafts must be token for
token the output without them (and transformers' greedy generate), with
drafts proposed, some accepted and some rejected, in steps that mix draft
rows with prefill chunks and rows that sample normally.
"""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest

from baton_worker.model.config import ConfigError
from baton_worker.protocol import AddedRequest, ProtocolError, SamplingParams, SpecWork, Step
from baton_worker.runtime.loading import load_worker
from baton_worker.runtime.options import OptionsError, WorkerOptions, parse_options
from baton_worker.spec.ngram import NgramProposer, propose_ngram
from engine_sim import EngineSim, SimRequest
from hf_reference import hf_greedy
from random_models import make_model_dir

BLOCK = 4
NUM_BLOCKS = 160
K = 3


# ------------------------------------------------------------ the proposer


def _p(tokens, k=3, lo=1, hi=3):
    return propose_ngram(np.asarray(tokens, np.int32), k, lo, hi).tolist()


def test_ngram_longest_match_wins():
    # Suffix [7, 8, 9]: the 3-gram occurs at 0 (followed by 1, 2); the 1-gram 9 alone occurs later, at 6 (followed by 4).
    seq = [7, 8, 9, 1, 2, 3, 9, 4, 5, 7, 8, 9]
    assert _p(seq) == [1, 2, 3]
    # With n at most 1 the most recent 9 wins.
    assert _p(seq, hi=1) == [4, 5, 7]
    # A 2-gram match when the 3-gram has none: [8, 9] at 1 (the 3-gram [6, 8, 9] does not occur).
    assert _p([5, 8, 9, 1, 2, 6, 8, 9]) == [1, 2, 6]


def test_ngram_most_recent_occurrence():
    seq = [1, 2, 10, 11, 1, 2, 20, 21, 1, 2]
    assert _p(seq) == [20, 21, 1]
    assert _p(seq, k=1) == [20]  # the K cap


def test_ngram_no_match_and_min_length():
    assert _p([1, 2, 3, 4, 5]) == []
    assert _p([4]) == []
    assert _p([]) == []
    # Only a 1-gram matches: refused when the shortest allowed n is 2.
    assert _p([3, 5, 6, 7, 3], lo=1) == [5, 6, 7]
    assert _p([3, 5, 6, 7, 3], lo=2) == []


def test_ngram_match_near_the_end():
    # The earlier occurrence is followed by fewer than k tokens: the copy runs on over its own drafts
    # (the sequence repeats with the period the match shows), so k drafts still come.
    assert _p([9, 1, 2, 1, 2], k=5) == [1, 2, 1, 2, 1]
    assert _p([5, 5, 5], k=4) == [5, 5, 5, 5]  # [5, 5] at 0, one token after it: period 1
    assert _p([7, 3, 8, 4, 3, 8], k=4) == [4, 3, 8, 4]  # period 3, from the occurrence at 1
    assert NgramProposer(2, 1, 3).propose(np.array([4, 6, 4, 6, 4], np.int32)).tolist() == [6, 4]


def test_ngram_is_vectorized_over_long_sequences():
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 50_000, 200_000).astype(np.int32)
    seq[1000:1004] = seq[-4:]  # a long earlier match of the last 4 tokens
    assert propose_ngram(seq, 5, 1, 4).tolist() == seq[1004:1009].tolist()


# ------------------------------------------------------------ options and refusals


def test_options():
    base = ["--model", "m", "--in-endpoint", "a", "--out-endpoint", "b", "--block-size", "16"]
    opts = parse_options(base)
    assert (opts.num_speculative_tokens, opts.prompt_lookup_min, opts.prompt_lookup_max) == (0, 1, 3)
    opts = parse_options(base + ["--num-speculative-tokens", "5", "--prompt-lookup-min", "2", "--prompt-lookup-max", "4"])
    assert (opts.num_speculative_tokens, opts.prompt_lookup_min, opts.prompt_lookup_max) == (5, 2, 4)
    with pytest.raises(OptionsError, match="--num-speculative-tokens must be >= 0"):
        parse_options(base + ["--num-speculative-tokens", "-1"])
    with pytest.raises(OptionsError, match="--prompt-lookup-max 1 is below --prompt-lookup-min 2"):
        parse_options(base + ["--prompt-lookup-min", "2", "--prompt-lookup-max", "1"])


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_model_dir("llama", tmp_path_factory.mktemp("spec") / "llama", 3)


def _worker(model_dir, spec=K, **kwargs):
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=BLOCK, num_blocks=NUM_BLOCKS, dtype="float32",
                         num_speculative_tokens=spec, **kwargs)
    return load_worker(opts)


def test_loading_refuses_what_speculation_does_not_apply_to(llama_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"^--num-speculative-tokens 2: .* not a pooling model \(--runner pooling\)"):
        _worker(llama_dir, spec=2, runner="pooling")
    with pytest.raises(ConfigError, match=r"not --tensor-parallel-size above 1"):
        _worker(llama_dir, spec=2, tensor_parallel_size=2)
    graph = tmp_path / "graph"
    graph.mkdir()
    (graph / "config.json").write_text(json.dumps({"architectures": ["BatonDemoTTS"]}))
    with pytest.raises(ConfigError, match=r"not BatonDemoTTS, a graph model"):
        _worker(graph, spec=2)
    runner = _worker(llama_dir, spec=2).runner
    assert runner.proposer is not None and runner.proposer.k == 2 and not runner.overlap


def _step(step_id, added, rows, blocks, spec=None):
    """rows: (req_id, num_new, num_computed, new_blocks, sample)."""
    col = lambda j: np.array([r[j] for r in rows], np.int32)  # noqa: E731
    return Step(step_id, added, np.zeros(0, np.int32), col(0), col(1), col(2), col(3), np.array(blocks, np.int32),
                np.array([r[4] for r in rows], np.uint8), spec=spec)


def test_protocol_errors(llama_dir):
    prompt = np.array([5, 6, 7, 8, 5, 6], np.int32)
    added = [AddedRequest(1, prompt, len(prompt), SamplingParams(temperature=0.0))]
    spec = SpecWork(np.array([1], np.int32), np.array([7], np.int32))
    off = _worker(llama_dir, spec=0, load_format="dummy-null").runner
    with pytest.raises(ProtocolError, match=r"^Step\.spec: .*--num-speculative-tokens 0"):
        off.execute(_step(0, added, [(1, 7, 0, 2, 1)], [0, 1], spec))
    runner = _worker(llama_dir, spec=2, load_format="dummy-null").runner
    result = runner.execute(_step(0, added, [(1, 6, 0, 2, 1)], [0, 1]))
    # dummy-null predicts token + 1: 7 follows 6; the proposal comes from [5, 6, 7] ... [5, 6, 7]: 8, 5.
    assert result.token_ids.tolist() == [7] and result.token_counts is None
    assert result.draft_counts.tolist() == [2] and result.draft_ids.tolist() == [8, 5]
    too_many = SpecWork(np.array([3], np.int32), np.array([8, 9, 10], np.int32))
    with pytest.raises(ProtocolError, match=r"^Step\.spec\.draft_counts\[0\]: 3 drafts is outside \[0, --num-speculative-tokens 2\]"):
        runner.execute(_step(1, [], [(1, 4, 6, 0, 1)], [], too_many))
    with pytest.raises(ProtocolError, match=r"^Step\.spec\.draft_ids: has 1 ids"):
        runner.execute(_step(1, [], [(1, 3, 6, 0, 1)], [], SpecWork(np.array([2], np.int32), np.array([8], np.int32))))
    penalized = AddedRequest(2, prompt, len(prompt), SamplingParams(temperature=1.0, seed=3, frequency_penalty=0.5))
    with pytest.raises(ProtocolError, match=r"^Step\.spec\.draft_counts\[0\]: request 2 asks for penalties"):
        runner.execute(_step(1, [penalized], [(2, 7, 0, 2, 1)], [4, 5], SpecWork(np.array([1], np.int32), np.array([7], np.int32))))
    # Accepted: 8 (= 7 + 1), then 5 is rejected (the target says 9): two tokens appended.
    result = runner.execute(_step(1, [], [(1, 3, 6, 1, 1)], [2], SpecWork(np.array([2], np.int32), np.array([8, 5], np.int32))))
    assert result.token_ids.tolist() == [8, 9] and result.token_counts.tolist() == [2]
    state = runner.requests[1]
    assert state.token_ids == prompt.tolist() + [7, 8, 9]
    assert runner.batch.lengths[state.slot] == 9
    assert runner.batch.tokens[state.slot, :9].tolist() == state.token_ids


# ------------------------------------------------------------ parity


def _prompts(vocab: int, seed: int) -> list[list[int]]:
    """Prompts that repeat a pattern (so the proposer finds matches), of different lengths."""
    rng = random.Random(seed)
    out = []
    for width, times in ((2, 8), (1, 10), (3, 6), (4, 4)):
        pattern = [rng.randrange(vocab) for _ in range(width)]
        out.append([rng.randrange(vocab)] + pattern * times)
    return out


class _GraphsSpy:
    """Stands in for cuda_graphs.DecodeGraphs: records the steps offered to it, replays none (eager path)."""

    def __init__(self):
        self.offered = 0
        self.verify_offered = 0

    def run(self, inputs):
        self.offered += 1
        return None

    def verify(self, inputs):
        self.verify_offered += 1
        return None


def _run(model_dir, prompts, spec, new_tokens, budget, load_format="auto", graphs=None, draft=None, sampled_row=True):
    loaded = _worker(model_dir, spec=spec, load_format=load_format, speculative_model=None if draft is None else str(draft))
    loaded.runner.graphs = graphs
    sim = EngineSim(loaded.runner, BLOCK, NUM_BLOCKS, token_budget=budget, seed=3, spec_tokens=spec)
    greedy = SamplingParams(temperature=0.0)
    requests = [SimRequest(i, p, new_tokens, greedy, arrive_step=2 * i) for i, p in enumerate(prompts)]
    # Sampled at temperature 1 with its own seed: drafted too, and verified by drawing each position with the
    # seed's own uniform number, so its tokens are the same with or without speculation.
    if sampled_row:
        requests.append(SimRequest(len(prompts), prompts[0], new_tokens, SamplingParams(temperature=1.0, seed=1234), arrive_step=1))
    sim.run(requests)
    return [r.output for r in requests], sim


# (arch, variant, prompt seed): random-weight models rarely continue a pattern, so these were picked (on
# the seeded weights) for runs where some drafts are accepted; tied embeddings (variant 3) help.
ARCHS = [("llama", 3, 0), ("qwen2", 3, 1), ("qwen3", 0, 0), ("mistral", 3, 2)]
NEW_TOKENS = 40


def _early_exit_draft(model_dir, out):
    """The model's first layer and its head as a draft model (a copy whose config has one layer)."""
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    return out


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
@pytest.mark.parametrize("arch,variant,seed", ARCHS, ids=[a for a, _, _ in ARCHS])
def test_greedy_with_drafts_matches_greedy_without(one_torch_thread, tmp_path, arch, variant, seed, method):
    """Greedy rows and a seeded sampled row: the same tokens with drafts as without, each method."""
    model_dir = make_model_dir(arch, tmp_path / arch, variant)
    prompts = _prompts(512, seed)
    draft = _early_exit_draft(model_dir, tmp_path / "draft") if method == "draft_model" else None
    plain, _ = _run(model_dir, prompts, 0, NEW_TOKENS, budget=7)
    drafted, sim = _run(model_dir, prompts, K, NEW_TOKENS, budget=7, draft=draft)
    assert drafted == plain
    assert sim.proposed > 0 and sim.scheduled > 0
    assert sim.accepted > 0 and sim.rejected > 0, (sim.accepted, sim.rejected)
    # Steps mixing draft rows with rows that run without drafts (prefill chunks, the seeded row).
    assert any(s.spec is not None and (s.spec.draft_counts == 0).any() for s in sim.steps)
    assert any(r.token_counts is not None for r in sim.results)


def test_drafts_match_transformers(one_torch_thread, llama_dir):
    prompts = _prompts(512, 0)
    expected = hf_greedy(llama_dir, prompts, NEW_TOKENS)
    graphs = _GraphsSpy()
    got, sim = _run(llama_dir, prompts, K, NEW_TOKENS, budget=6, graphs=graphs)
    assert got[: len(prompts)] == expected
    # Steps without drafts are offered to the decode graphs as decode steps; those with drafts whose rows all
    # decode, as verify steps (the spy replays neither, so all of them ran eagerly here).
    assert graphs.offered == sum(s.spec is None and len(s.req_ids) > 0 for s in sim.steps)
    verifiable = [s for s in sim.steps if s.spec is not None and (s.num_new_tokens == s.spec.draft_counts + 1).all()]
    assert verifiable
    assert graphs.verify_offered == len(verifiable)
    assert sim.accepted > 0 and sim.rejected > 0


def test_cuda_path_verifies_drafts_through_the_decode_graphs(one_torch_thread, tmp_path):
    """What a CUDA worker runs, in Triton's interpreter: Triton attention and layer kernels, and verify steps
    replayed through the decode graphs' static inputs with every token a row. Greedy output equals
    transformers', and the verify steps took that path."""
    pytest.importorskip("triton")
    from baton_worker.model.layer_ops import TritonOps
    from baton_worker.runtime.cuda_graphs import DecodeGraphs

    model_dir = make_model_dir("llama", tmp_path / "llama", 3)
    prompts = _prompts(512, 0)[:3]
    new_tokens = 24
    expected = hf_greedy(model_dir, prompts, new_tokens)
    loaded = _worker(model_dir, attention_backend="triton")
    runner = loaded.runner
    runner.model.ops = TritonOps(loaded.config.rms_norm_eps)
    runner.graphs = DecodeGraphs(runner.model, runner.attention, NUM_BLOCKS, max_rows=16, capture=False)
    verify, replayed = runner.graphs.verify, []
    runner.graphs.verify = lambda inputs: replayed.append(len(inputs.input_ids_host)) or verify(inputs)
    sim = EngineSim(runner, BLOCK, NUM_BLOCKS, token_budget=8, seed=3, spec_tokens=K)
    greedy = SamplingParams(temperature=0.0)
    requests = [SimRequest(i, p, new_tokens, greedy, arrive_step=2 * i) for i, p in enumerate(prompts)]
    sim.run(requests)
    assert [r.output for r in requests] == expected
    assert sim.accepted > 0 and sim.rejected > 0
    # Verify steps of several rows with drafts went through the graphs' static inputs.
    assert any(t > K + 1 for t in replayed), replayed


def test_dummy_null_verifies_its_counting_model(llama_dir):
    """dummy-null's "model" predicts (token + 1) % vocab: a prompt that counts up is drafted and accepted."""
    prompts = [[5, 6, 7, 8, 9, 5, 6], [20, 21, 22, 20, 21, 22, 20]]
    plain, _ = _run(llama_dir, prompts, 0, 12, budget=9, load_format="dummy-null")
    drafted, sim = _run(llama_dir, prompts, K, 12, budget=9, load_format="dummy-null")
    assert drafted == plain
    assert drafted[0] == [(6 + i) % 512 for i in range(1, 13)]
    assert sim.accepted > 0 and sim.rejected > 0


# ------------------------------------------------------------ the draft_model method


def test_draft_model_that_is_the_target_drafts_what_it_decodes(one_torch_thread, llama_dir):
    """The target as its own draft: every draft is the target's own greedy token, so (but for rounding between
    batch shapes) all are accepted, and the output is greedy decoding's."""
    prompts = _prompts(512, 0)
    plain, _ = _run(llama_dir, prompts, 0, NEW_TOKENS, budget=7, sampled_row=False)
    drafted, sim = _run(llama_dir, prompts, K, NEW_TOKENS, budget=7, draft=llama_dir, sampled_row=False)
    assert drafted == plain
    assert sim.proposed > 0
    assert sim.rejected <= 0.05 * (sim.accepted + sim.rejected), (sim.accepted, sim.rejected)
    # Exactly K drafts a row, except where max_tokens leaves fewer to verify.
    assert sim.accepted + sim.rejected >= 0.8 * K * sum(s.spec is not None and int((s.spec.draft_counts > 0).sum()) for s in sim.steps)


def test_draft_model_other_weights_match_transformers(one_torch_thread, llama_dir, tmp_path):
    """A different (random) draft of the same vocabulary: drafts are mostly rejected, and the output is still
    transformers' greedy output. Its cache's blocks all come back when the requests leave."""
    draft_dir = make_model_dir("qwen3", tmp_path / "draft", 0)
    prompts = _prompts(512, 1)
    expected = hf_greedy(llama_dir, prompts, NEW_TOKENS)
    loaded = _worker(llama_dir, speculative_model=str(draft_dir))
    proposer = loaded.runner.proposer
    sim = EngineSim(loaded.runner, BLOCK, NUM_BLOCKS, token_budget=6, seed=3, spec_tokens=K)
    requests = [SimRequest(i, p, NEW_TOKENS, SamplingParams(temperature=0.0), arrive_step=2 * i) for i, p in enumerate(prompts)]
    sim.run(requests)
    assert [r.output for r in requests] == expected
    assert sim.proposed > 0 and sim.rejected > 0
    assert proposer.blocks and len(proposer.free) < proposer.num_blocks
    sim.step(requests)  # one more step carries the last removals
    assert len(proposer.free) == proposer.num_blocks and not proposer.blocks


def test_draft_model_refusals(llama_dir, tmp_path):
    with pytest.raises(ConfigError, match="no config.json in that directory"):
        _worker(llama_dir, speculative_model=str(tmp_path))
    big = make_model_dir("llama", tmp_path / "big", 0)
    config = json.loads((big / "config.json").read_text())
    config["vocab_size"] = 1024
    (big / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"its vocabulary \(1024 tokens\) is larger than the target's \(512\)"):
        _worker(llama_dir, speculative_model=str(big))
    with pytest.raises(ConfigError, match="a draft model needs the target's weights"):
        _worker(llama_dir, speculative_model=str(llama_dir), load_format="dummy-null")
    with pytest.raises(OptionsError, match="--speculative-model needs --num-speculative-tokens of at least 1"):
        parse_options(["--model", "m", "--in-endpoint", "a", "--out-endpoint", "b", "--block-size", "4", "--speculative-model", "d"])


# ------------------------------------------------------------ sampled rows: rejection sampling


def test_sampled_rows_keep_the_target_distribution(llama_dir):
    """2,000 seeded requests at temperature 1 with the same prompt, each verifying the same two drafts (x1,
    x2: the most likely tokens) in one step. The first token must be distributed as the target's softmax,
    x1 accepted with probability p(x1), the second token (after an accepted x1) as the target's softmax
    after x1; and each seeded request's first token is the one it draws without speculation."""
    import torch

    from hf_reference import load_model

    n, prompt = 2000, np.array([5, 17, 300, 42, 9, 77], np.int32)
    model = load_model(llama_dir, "float32")
    with torch.no_grad():
        p1 = torch.softmax(model(torch.tensor([prompt.tolist()])).logits[0, -1].double(), -1).numpy()
        x1 = int(p1.argmax())
        p2 = torch.softmax(model(torch.tensor([prompt.tolist() + [x1]])).logits[0, -1].double(), -1).numpy()
    x2 = int(p2.argmax())

    def first_tokens(spec: int) -> tuple[np.ndarray, np.ndarray | None]:
        opts = WorkerOptions(model=str(llama_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=2 * n + 8, dtype="float32",
                             num_speculative_tokens=spec)
        runner = load_worker(opts).runner
        added = [AddedRequest(i, prompt, len(prompt), SamplingParams(temperature=1.0, seed=i)) for i in range(n)]
        # Step 0 runs the first 5 prompt tokens of every request; step 1 its last one (with the drafts).
        runner.execute(_step(0, added, [(i, 5, 0, 2, 0) for i in range(n)], list(range(2 * n))))
        drafts = SpecWork(np.full(n, 2, np.int32), np.tile(np.array([x1, x2], np.int32), n)) if spec else None
        result = runner.execute(_step(1, [], [(i, 3 if spec else 1, 5, 0, 1) for i in range(n)], [], drafts))
        if not spec:
            return result.token_ids, None
        counts = result.token_counts if result.token_counts is not None else np.ones(n, np.int32)
        starts = np.cumsum(counts) - counts
        return result.token_ids[starts], np.array([result.token_ids[s + 1] if c > 1 and result.token_ids[s] == x1 else -1
                                                   for s, c in zip(starts, counts)])

    first, second = first_tokens(2)
    alone, _ = first_tokens(0)
    assert (first == alone).all(), "a seeded row draws other tokens with speculation than without"

    def fits(tokens: np.ndarray, p: np.ndarray) -> bool:
        """Pearson's chi-square test at the 0.1% level, over the likeliest tokens expected at least 10
        times (at most 8) and the rest as one bin."""
        top = [t for t in np.argsort(-p)[:8] if p[t] * len(tokens) >= 10]
        observed = np.array([(tokens == t).sum() for t in top] + [len(tokens) - np.isin(tokens, top).sum()], np.float64)
        expected = np.append(p[top], 1 - p[top].sum()) * len(tokens)
        statistic = float(((observed - expected) ** 2 / expected).sum())
        critical = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12][len(top) - 1]  # by degrees of freedom
        return statistic < critical

    assert fits(first, p1)
    accepted = first == x1
    sigma = np.sqrt(p1[x1] * (1 - p1[x1]) / n)
    assert abs(accepted.mean() - p1[x1]) < 4 * sigma, (accepted.mean(), p1[x1])
    after = second[accepted]
    assert (after >= 0).all() and len(after) > 200
    assert fits(after, p2)


def test_logprobs_of_drafted_rows_are_those_without_drafts(one_torch_thread, llama_dir):
    """Rows asking for logprobs (greedy and seeded, top 3) speculate too; every token's logprob and top
    alternatives equal those of the same run without drafts."""

    def run(spec: int) -> tuple[list[SimRequest], EngineSim]:
        loaded = _worker(llama_dir, spec=spec)
        sim = EngineSim(loaded.runner, BLOCK, NUM_BLOCKS, token_budget=7, seed=3, spec_tokens=spec)
        params = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(temperature=0.9, seed=11, logprobs=0),
                  SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=20, seed=5, logprobs=2)]
        requests = [SimRequest(i, p, 24, params[i], arrive_step=i) for i, p in enumerate(_prompts(512, 0))]
        sim.run(requests)
        return requests, sim

    plain, _ = run(0)
    drafted, sim = run(K)
    assert sim.accepted > 0
    drafted_ids = {int(r) for s in sim.steps if s.spec is not None for r, n in zip(s.req_ids, s.spec.draft_counts) if n > 0}
    assert {0, 1, 3} <= drafted_ids, drafted_ids  # the rows asking for logprobs verified drafts
    for a, b in zip(plain, drafted):
        assert b.output == a.output
        assert len(b.logprobs) == len(a.logprobs) and np.allclose(b.logprobs, a.logprobs, atol=1e-5)
        assert [ids for ids, _ in b.tops] == [ids for ids, _ in a.tops]
        assert all(np.allclose(x, y, atol=1e-5) for (_, x), (_, y) in zip(b.tops, a.tops))
    assert len(drafted[0].tops) == 24 and all(len(ids) == 3 for ids, _ in drafted[0].tops)
