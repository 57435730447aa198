"""The batched sampler against the per-row sampler it replaced (ReferenceSampler below).

Seeded and greedy rows must give the same tokens, step after step, in mixed
batches and across preemption (a request recreated with its tokens replayed);
unseeded rows must follow the same distributions; logprobs must be the same.
"""

from __future__ import annotations

import gc
import math
import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from baton_worker.protocol import SamplingParams
from baton_worker.runtime.request_state import RequestState
from baton_worker.sampling.sampler import SAMPLING_EPS, VOCAB_BLOCK, SampleOutput, Sampler, seeded_uniform

# ---------------------------------------------------------------------------
# The per-row sampler as it was before batching (baton_worker/sampling/sampler.py at
# c486cff), kept as the reference. Changes since: its penalty tensors live in
# its own books instead of on the RequestState; a seeded row's uniform number
# is seeded_uniform(seed, output position) instead of the next number of a
# per-request generator (so preemption cannot change it); a draw over the
# whole vocabulary sums blocks of VOCAB_BLOCK tokens before the block it lands
# in (not one cumsum along the row); u * total is kept below total.


@dataclass
class _Books:
    state: RequestState  # keeps the id(state) key unique while the books live
    output_counts: torch.Tensor | None = None
    seen_mask: torch.Tensor | None = None
    counted: int = 0


def _is_greedy(state: RequestState) -> bool:
    return state.sampling.temperature < SAMPLING_EPS


def _needs_processing(state: RequestState) -> bool:
    s = state.sampling
    return (
        not _is_greedy(state)
        or s.repetition_penalty != 1.0
        or s.frequency_penalty != 0.0
        or s.presence_penalty != 0.0
        or (state.num_output_tokens < s.min_tokens and len(s.suppress_token_ids) > 0)
        or len(s.allowed_token_ids) > 0
        or len(s.logit_bias_ids) > 0
    )


class ReferenceSampler:
    def __init__(self, seed: int, device: torch.device):
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.books: dict[int, _Books] = {}

    def _books(self, state: RequestState) -> _Books:
        books = self.books.get(id(state))
        if books is None:
            books = self.books[id(state)] = _Books(state)
        return books

    def sample(self, logits: torch.Tensor, states: list[RequestState]) -> SampleOutput:
        tokens = torch.argmax(logits, dim=-1) if logits.shape[0] else torch.zeros(0, dtype=torch.int64)
        for i, state in enumerate(states):
            if _needs_processing(state):
                tokens[i] = self._sample_row(logits[i], state)
        token_ids = tokens.to(torch.int32).cpu().numpy()
        return self._with_logprobs(logits, states, token_ids)

    def _sample_row(self, raw: torch.Tensor, state: RequestState) -> int:
        s = state.sampling
        logits = raw.clone()
        if len(s.allowed_token_ids):
            mask = torch.full_like(logits, float("-inf"))
            mask[torch.as_tensor(np.asarray(s.allowed_token_ids, dtype=np.int64))] = 0.0
            logits = logits + mask
        for token, bias in zip(s.logit_bias_ids.tolist(), np.asarray(s.logit_bias_values, np.float32)):
            logits[token] += torch.tensor(bias)
        if state.num_output_tokens < s.min_tokens and len(s.suppress_token_ids) > 0:
            ids = torch.as_tensor(np.asarray(s.suppress_token_ids, dtype=np.int64), device=logits.device)
            logits[ids[ids < logits.numel()]] = float("-inf")
        logits = self._apply_penalties(logits, state)
        if _is_greedy(state):
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / s.temperature, dim=-1)
        ids, weights = _restrict(probs, s.min_p, s.top_k, s.top_p)
        if s.seed is None:
            u = torch.rand(1, generator=self.generator, device=probs.device)
        else:
            u = torch.tensor([seeded_uniform(s.seed, state.num_output_tokens)], device=probs.device)
        if ids is None:
            return _draw_blocked(weights, u)
        cdf = torch.cumsum(weights, dim=0)
        pick = int(torch.searchsorted(cdf, _below(u * cdf[-1], cdf[-1]), right=True).clamp(max=cdf.numel() - 1))
        return int(ids[pick])

    def _apply_penalties(self, logits: torch.Tensor, state: RequestState) -> torch.Tensor:
        s = state.sampling
        if s.repetition_penalty == 1.0 and s.frequency_penalty == 0.0 and s.presence_penalty == 0.0:
            return logits
        books = self._books(state)
        _update_counts(state, books, logits.numel(), logits.device)
        if s.repetition_penalty != 1.0:
            penalised = torch.where(logits > 0, logits / s.repetition_penalty, logits * s.repetition_penalty)
            logits = torch.where(books.seen_mask, penalised, logits)
        if s.frequency_penalty != 0.0 or s.presence_penalty != 0.0:
            counts = books.output_counts.to(logits.dtype)
            logits = logits - s.frequency_penalty * counts - s.presence_penalty * (counts > 0).to(logits.dtype)
        return logits

    def _with_logprobs(self, logits: torch.Tensor, states: list[RequestState], token_ids: np.ndarray) -> SampleOutput:
        wanted = [s.sampling.logprobs for s in states]
        if not any(n >= 0 for n in wanted):
            return SampleOutput(token_ids, None, None, None, None)
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, torch.as_tensor(token_ids, dtype=torch.int64, device=logits.device)[:, None])
        out = SampleOutput(token_ids, chosen[:, 0].cpu().numpy().astype(np.float32), None, None, None)
        if not any(n > 0 for n in wanted):
            return out
        vocab = logprobs.shape[1]
        counts = np.array([min(max(n, 0), vocab) for n in wanted], dtype=np.int32)
        top_ids, top_lps = [], []
        for i, n in enumerate(counts):
            if n > 0:
                values, ids = torch.topk(logprobs[i], int(n))
                top_ids.append(ids.cpu().numpy().astype(np.int32))
                top_lps.append(values.cpu().numpy().astype(np.float32))
        out.top_counts = counts
        out.top_ids = np.concatenate(top_ids) if top_ids else np.zeros(0, np.int32)
        out.top_logprobs = np.concatenate(top_lps) if top_lps else np.zeros(0, np.float32)
        return out


def _update_counts(state: RequestState, books: _Books, vocab: int, device: torch.device) -> None:
    if books.output_counts is None:
        books.output_counts = torch.zeros(vocab, dtype=torch.int32, device=device)
        books.seen_mask = torch.zeros(vocab, dtype=torch.bool, device=device)
        books.counted = 0
    new = torch.as_tensor(state.token_ids[books.counted :], dtype=torch.int64, device=device)
    new_outputs = state.token_ids[max(books.counted, state.num_prompt_tokens) :]
    new = new[new < vocab]
    books.seen_mask[new] = True
    if new_outputs:
        out = torch.as_tensor(new_outputs, dtype=torch.int64, device=device)
        out = out[out < vocab]
        books.output_counts += torch.bincount(out, minlength=vocab).to(torch.int32)
    books.counted = len(state.token_ids)


def _below(target: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    return torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))


def _draw_blocked(weights: torch.Tensor, u: torch.Tensor) -> int:
    """The whole-vocabulary draw of one row: block sums, their running total,
    then the cumulative weights inside the block the target falls in."""
    n, b = weights.numel(), VOCAB_BLOCK
    full = n // b * b
    sums = ([weights[:full].view(-1, b).sum(-1)] if full else []) + ([weights[full:].sum(-1, keepdim=True)] if full < n else [])
    cum = torch.cumsum(torch.cat(sums), dim=0)
    target = _below(u * cum[-1], cum[-1])
    block = int(torch.searchsorted(cum, target, right=True).clamp(max=cum.numel() - 1))
    rest = target - (cum[block - 1] if block else 0.0)
    inside = weights[block * b : (block + 1) * b]
    last = int(torch.nonzero(inside > 0).max())
    return block * b + min(int(torch.searchsorted(torch.cumsum(inside, dim=0), rest, right=True)), last)


def _restrict(probs: torch.Tensor, min_p: float, top_k: int, top_p: float) -> tuple[torch.Tensor | None, torch.Tensor]:
    if min_p > 0.0:
        probs = torch.where(probs < probs.max() * min_p, torch.zeros_like(probs), probs)
    ids, weights = None, probs
    vocab = probs.numel()
    if 0 < top_k < vocab:
        weights, ids = torch.topk(probs, top_k)
    if top_p < 1.0:
        if ids is None:
            weights, ids = _top_mass(probs, top_p)
        total = weights.sum()
        before = torch.cumsum(weights, dim=0) - weights
        keep = int((before < top_p * total).sum().clamp(min=1))
        weights, ids = weights[:keep], ids[:keep]
    return ids, weights


def _top_mass(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    total = probs.sum()
    k = 64
    while True:
        k = min(k, probs.numel())
        weights, ids = torch.topk(probs, k)
        if k == probs.numel() or weights.sum() >= top_p * total:
            return weights, ids
        k *= 4


# ---------------------------------------------------------------------------

CPU = torch.device("cpu")


def _random_params(rng: random.Random, vocab: int) -> SamplingParams:
    """A mix of everything: greedy or hot, seeded or not, restrictions, allowed tokens, logit bias, penalties, min_tokens, logprobs."""
    greedy = rng.random() < 0.2
    bias_ids = rng.choice([[], [], rng.sample(range(vocab), 6)])
    return SamplingParams(
        temperature=0.0 if greedy else rng.choice([0.5, 0.8, 1.0, 1.5]),
        top_k=rng.choice([0, 0, 1, 5, 40, 40, 300]),
        top_p=rng.choice([1.0, 1.0, 0.3, 0.9, 0.95]),
        min_p=rng.choice([0.0, 0.0, 0.02, 0.2]),
        seed=rng.choice([None, rng.randrange(-(2**40), 2**40)]),
        repetition_penalty=rng.choice([1.0, 1.0, 1.3, 0.8]),
        frequency_penalty=rng.choice([0.0, 0.0, 0.5, -0.4]),
        presence_penalty=rng.choice([0.0, 0.0, 0.7]),
        min_tokens=rng.choice([0, 0, 3]),
        suppress_token_ids=np.array(rng.sample(range(vocab), 3), np.int32),
        allowed_token_ids=np.array(rng.choice([[], [], [], rng.sample(range(vocab), 24)]), np.int32),
        logit_bias_ids=np.array(bias_ids, np.int32),
        logit_bias_values=np.array([rng.choice([-100.0, -3.5, 0.25, 2.0, 100.0]) for _ in bias_ids], np.float32),
        logprobs=rng.choice([-1, -1, 0, 2, 5]),
    )


@dataclass
class _Request:
    req_id: int
    prompt: list[int]
    params: SamplingParams
    tokens: list[int]
    ours: RequestState | None = None
    theirs: RequestState | None = None

    def start(self) -> None:
        """(Re)creates both states from the tokens so far, as after admission or preemption."""
        self.ours = RequestState(self.req_id, list(self.tokens), len(self.prompt), self.params)
        self.theirs = RequestState(self.req_id, list(self.tokens), len(self.prompt), self.params)


def _logits(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    # bf16-rounded logits: plenty of exact ties, as a bf16 model produces.
    return (torch.randn(rows, vocab, generator=gen) * 2.5).to(torch.bfloat16).to(torch.float32)


@pytest.mark.parametrize("vocab,requests,steps", [(512, 24, 12), (151936, 10, 3)])
def test_seeded_and_greedy_rows_match_the_reference_through_steps(vocab, requests, steps):
    rng = random.Random(vocab)
    gen = torch.Generator().manual_seed(vocab)
    reqs = []
    for i in range(requests):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))]
        reqs.append(_Request(i, prompt, _random_params(rng, vocab), list(prompt)))
    # Large top-p windows (more than one thread's share of a sum) on the big vocabulary.
    reqs[0].params = SamplingParams(temperature=3.0, top_p=0.97, seed=11, logprobs=3)
    reqs[1].params = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=12, repetition_penalty=1.2)
    reqs[2].params = SamplingParams(temperature=1.0, top_k=40, seed=13, min_p=0.05)
    reqs[3].params = SamplingParams(temperature=0.9, top_p=0.8)
    ours, theirs = Sampler(7, CPU), ReferenceSampler(7, CPU)
    compared = 0
    for step in range(steps):
        live = [r for r in reqs if rng.random() < 0.85]
        rng.shuffle(live)  # batch-mates and row order change every step
        for r in live:
            if r.ours is None or rng.random() < 0.15:
                r.start()  # admitted, or preempted and recomputed: tokens replayed
        logits = _logits(gen, len(live), vocab)
        a = ours.sample(logits.clone(), [r.ours for r in live])
        b = theirs.sample(logits.clone(), [r.theirs for r in live])
        for i, r in enumerate(live):
            deterministic = r.params.seed is not None or r.params.temperature < SAMPLING_EPS
            if deterministic:
                assert a.token_ids[i] == b.token_ids[i], (step, r.req_id, r.params)
                compared += 1
            token = int(a.token_ids[i])
            r.tokens.append(token)
            r.ours.token_ids.append(token)
            r.theirs.token_ids.append(token)
        _assert_same_logprobs(a, b, [r.params.seed is not None or r.params.temperature < SAMPLING_EPS for r in live])
    assert compared >= steps * 2


def _assert_same_logprobs(a: SampleOutput, b: SampleOutput, same_token: list[bool]) -> None:
    assert (a.logprobs is None) == (b.logprobs is None)
    if a.logprobs is None:
        return
    rows = np.flatnonzero(same_token)
    np.testing.assert_array_equal(a.logprobs[rows], b.logprobs[rows])
    assert (a.top_counts is None) == (b.top_counts is None)
    if a.top_counts is not None:
        np.testing.assert_array_equal(a.top_counts, b.top_counts)
        np.testing.assert_array_equal(a.top_logprobs, b.top_logprobs)
        # Tied logprobs may list their ids in another order; the values at each place agree.
        assert len(a.top_ids) == len(b.top_ids)


def test_seeded_request_alone_equals_reference_alone_and_in_any_batch():
    vocab = 4096
    gen = torch.Generator().manual_seed(3)
    params = SamplingParams(temperature=1.2, top_k=100, top_p=0.9, min_p=0.01, seed=99, frequency_penalty=0.3)
    logits = _logits(gen, 30, vocab)
    ref_state = RequestState(0, [1, 2, 3], 3, params)
    ref = ReferenceSampler(0, CPU)
    expected = []
    for step in range(30):
        expected.append(int(ref.sample(logits[step : step + 1].clone(), [ref_state]).token_ids[0]))
        ref_state.token_ids.append(expected[-1])
    ours = Sampler(1, CPU)
    st = RequestState(0, [1, 2, 3], 3, params)
    rng = random.Random(0)
    got = []
    for step in range(30):
        mates = [RequestState(10 + j, [5], 1, _random_params(rng, vocab)) for j in range(rng.randrange(0, 6))]
        rows = mates + [st]
        rng.shuffle(rows)
        batch = _logits(gen, len(rows), vocab)
        batch[rows.index(st)] = logits[step]
        out = ours.sample(batch, rows)
        got.append(int(out.token_ids[rows.index(st)]))
        st.token_ids.append(got[-1])
    assert got == expected
    assert len(set(got)) > 5


# --------------------------------------------------------------- distributions


def _reference_distribution(logits: torch.Tensor, params: SamplingParams) -> np.ndarray:
    """What the reference draws from: its restricted, renormalised support."""
    probs = torch.softmax(logits / params.temperature, dim=-1)
    ids, weights = _restrict(probs, params.min_p, params.top_k, params.top_p)
    dist = np.zeros(logits.numel())
    w = (weights / weights.sum()).double().numpy()
    if ids is None:
        dist[:] = w
    else:
        np.add.at(dist, ids.numpy(), w)
    return dist


def _chi_square_limit(df: int, z: float = 3.72) -> float:
    """Wilson-Hilferty: the chi-square quantile at normal deviate z (3.72: p = 1e-4)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_unseeded_rows_follow_the_reference_distributions():
    draws = 20000
    gen = torch.Generator().manual_seed(5)
    peaked = torch.randn(16, generator=gen) * 1.5
    flat = torch.randn(300, generator=gen) * 0.05  # top-p needs a window of more than 64 tokens
    cases = [
        (peaked, SamplingParams(temperature=1.0)),
        (peaked, SamplingParams(temperature=0.7, top_k=5)),
        (peaked, SamplingParams(temperature=1.3, top_k=9, top_p=0.8)),
        (peaked, SamplingParams(temperature=0.7, top_p=0.9)),
        (peaked, SamplingParams(temperature=1.0, min_p=0.1)),
        (peaked, SamplingParams(temperature=2.0, min_p=0.05, top_k=12, top_p=0.95)),
        (flat, SamplingParams(temperature=1.0, top_p=0.5)),
    ]
    # Every case in one batch: rows with different top-k share one window.
    sampler = Sampler(2024, CPU)
    for vocab in sorted({l.numel() for l, _ in cases}):
        group = [(l, p) for l, p in cases if l.numel() == vocab]
        logits = torch.cat([l.expand(draws, vocab) for l, _ in group])
        states = [RequestState(0, [1], 1, p) for _, p in group for _ in range(draws)]
        tokens = sampler.sample(logits, states).token_ids
        for j, (l, p) in enumerate(group):
            expected = _reference_distribution(l, p)
            seen = np.bincount(tokens[j * draws : (j + 1) * draws], minlength=vocab)
            support = expected > 0
            assert seen[~support].sum() == 0, p
            e = expected[support] * draws
            chi2 = float(((seen[support] - e) ** 2 / e).sum())
            assert chi2 < _chi_square_limit(max(int(support.sum()) - 1, 1)), (p, chi2)
            tv = 0.5 * np.abs(seen / draws - expected).sum()
            assert tv < 0.05, (p, tv)


def test_unseeded_rows_with_penalties_follow_the_reference_distribution():
    draws, vocab = 20000, 12
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(8))
    params = SamplingParams(temperature=1.0, top_k=8, repetition_penalty=1.5, frequency_penalty=0.4, presence_penalty=0.3)
    tokens = [2, 3, 3, 7, 7, 7]
    ref_state = RequestState(0, list(tokens), 2, params)
    penalised = ReferenceSampler(0, CPU)._apply_penalties(logits.clone(), ref_state)
    expected = _reference_distribution(penalised, params)
    states = [RequestState(i, list(tokens), 2, params) for i in range(draws)]
    out = Sampler(77, CPU).sample(logits.expand(draws, vocab).clone(), states).token_ids
    seen = np.bincount(out, minlength=vocab)
    support = expected > 0
    assert seen[~support].sum() == 0
    e = expected[support] * draws
    assert float(((seen[support] - e) ** 2 / e).sum()) < _chi_square_limit(int(support.sum()) - 1)


# --------------------------------------------------------------- bookkeeping


def test_penalty_rows_are_given_back_when_a_request_is_dropped():
    sampler = Sampler(0, CPU)
    logits = torch.randn(3, 32, generator=torch.Generator().manual_seed(0))
    states = [RequestState(i, [1, 2, 3], 2, SamplingParams(temperature=0.0, presence_penalty=1.0)) for i in range(3)]
    sampler.sample(logits, states)
    assert sampler.penalty_counts.rows_in_use == 3
    del states[1:]
    gc.collect()
    assert sampler.penalty_counts.rows_in_use == 1
    # A row handed to a new request starts from zero.
    again = RequestState(9, [4], 1, SamplingParams(temperature=0.0, frequency_penalty=2.0))
    sampler.sample(logits[:2], [states[0], again])
    assert int(sampler.penalty_counts.output_counts(again).sum()) == 0


def test_long_rows_are_summed_as_a_lone_row_would_be():
    # torch may split one long row's sum across threads but sums a batch row by
    # row; seeded top-p rows must round like the reference's lone row.
    from baton_worker.sampling.sampler import _row_sums

    probs = torch.softmax(torch.randn(6, 151936, generator=torch.Generator().manual_seed(4)) * 3, dim=-1)
    sums = _row_sums(probs, [True] * 6)
    assert all(torch.equal(sums[i], probs[i].clone().sum()) for i in range(6))
