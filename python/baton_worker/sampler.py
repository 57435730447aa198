"""Sampling on the worker, with vLLM semantics, batched over the step's rows.

Order per row: raw logprobs (for the response) from log_softmax of the raw
logits; min_tokens suppression; repetition penalty (prompt + output tokens),
frequency and presence penalties (output tokens only); then greedy argmax when
temperature is 0, else temperature, min-p, top-k, top-p and an inverse-CDF draw
with one uniform number per row: from the request's own generator when it has a
seed, from the sampler's generator otherwise (all such rows in one draw).

Every stage is one tensor operation over all the rows that need it. A seeded
request's tokens depend only on its seed and its logits, never on its
batch-mates: the per-row arithmetic is the same as drawing the row alone
(softmax, cumsum and topk treat rows independently; sums that torch would split
across threads for a lone row are taken row by row), so seeded rows in a
top-k group share its k exactly (tie order in topk depends on k), while
unseeded rows share one window of the largest k.

The result leaves the device in one copy per step: token ids, their logprobs
and the top logprobs are packed into one int32 tensor.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from .request_state import RequestState

# Below this temperature a request is treated as greedy (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5

# First top-p window tried for rows without top-k; grown 4x until it holds top_p of the mass.
_TOP_P_FIRST_WINDOW = 64


@dataclass
class SampleOutput:
    token_ids: np.ndarray  # int32 [rows]
    logprobs: np.ndarray | None  # float32 [rows]
    top_counts: np.ndarray | None  # int32 [rows]
    top_ids: np.ndarray | None  # int32 [sum(top_counts)]
    top_logprobs: np.ndarray | None  # float32 [sum(top_counts)]


def is_greedy(state: RequestState) -> bool:
    return state.sampling.temperature < SAMPLING_EPS


def has_penalties(state: RequestState) -> bool:
    s = state.sampling
    return s.repetition_penalty != 1.0 or s.frequency_penalty != 0.0 or s.presence_penalty != 0.0


def suppresses(state: RequestState) -> bool:
    s = state.sampling
    return state.num_output_tokens < s.min_tokens and len(s.suppress_token_ids) > 0


class Sampler:
    def __init__(self, seed: int, device: torch.device):
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.penalty_counts = PenaltyCounts(device)

    def sample(self, logits: torch.Tensor, states: list[RequestState]) -> SampleOutput:
        """logits: float32 [rows, vocab], one row per request that samples this step."""
        n = len(states)
        if n == 0:
            return SampleOutput(np.zeros(0, np.int32), None, None, None, None)
        processed = [i for i, st in enumerate(states) if not is_greedy(st) or has_penalties(st) or suppresses(st)]
        if not processed:
            tokens = torch.argmax(logits, dim=-1)
        elif len(processed) == n:
            tokens = self._sample_processed(logits, states, owned=False)
        else:
            tokens = torch.argmax(logits, dim=-1)
            index = _index(processed, logits.device)
            picked = self._sample_processed(logits.index_select(0, index), [states[i] for i in processed], owned=True)
            tokens.index_copy_(0, index, picked)
        return _to_host(logits, tokens, states)

    # ------------------------------------------------------------ processing

    def _sample_processed(self, logits: torch.Tensor, states: list[RequestState], owned: bool) -> torch.Tensor:
        """Tokens (int64 [rows], on the device) for rows that need more than a raw argmax.

        owned: logits is a private copy that may be changed in place.
        """
        logits, owned = self._suppress(logits, states, owned)
        logits = self._apply_penalties(logits, states, owned)
        greedy = [i for i, st in enumerate(states) if is_greedy(st)]
        if not greedy:
            return self._draw(logits, states)
        if len(greedy) == len(states):
            return torch.argmax(logits, dim=-1)
        tokens = torch.empty(len(states), dtype=torch.int64, device=logits.device)
        index = _index(greedy, logits.device)
        tokens.index_copy_(0, index, torch.argmax(logits.index_select(0, index), dim=-1))
        cold = set(greedy)
        hot = [i for i in range(len(states)) if i not in cold]
        index = _index(hot, logits.device)
        tokens.index_copy_(0, index, self._draw(logits.index_select(0, index), [states[i] for i in hot]))
        return tokens

    def _suppress(self, logits: torch.Tensor, states: list[RequestState], owned: bool) -> tuple[torch.Tensor, bool]:
        """min_tokens: the stop tokens get -inf until enough tokens are out."""
        vocab = logits.shape[1]
        flat = []
        for i, st in enumerate(states):
            if suppresses(st):
                ids = np.asarray(st.sampling.suppress_token_ids, dtype=np.int64)
                flat.append(ids[ids < vocab] + i * vocab)
        if not flat:
            return logits, owned
        out = logits if owned else logits.clone()
        out.view(-1).index_fill_(0, torch.as_tensor(np.concatenate(flat), device=logits.device), float("-inf"))
        return out, True

    def _apply_penalties(self, logits: torch.Tensor, states: list[RequestState], owned: bool) -> torch.Tensor:
        """Repetition (prompt and output tokens), frequency and presence (output tokens) penalties."""
        rows = [i for i, st in enumerate(states) if has_penalties(st)]
        if not rows:
            return logits
        counts, seen = self.penalty_counts.gather([states[i] for i in rows], logits.shape[1])
        index = _index(rows, logits.device) if len(rows) < len(states) else None
        sub = logits if index is None else logits.index_select(0, index)
        params = [states[i].sampling for i in rows]

        def column(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=logits.dtype, device=logits.device)[:, None]

        if any(s.repetition_penalty != 1.0 for s in params):
            rep = column([s.repetition_penalty for s in params])
            sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
        if any(s.frequency_penalty != 0.0 or s.presence_penalty != 0.0 for s in params):
            counts = counts.to(logits.dtype)
            freq, pres = column([s.frequency_penalty for s in params]), column([s.presence_penalty for s in params])
            sub = sub - freq * counts - pres * (counts > 0).to(logits.dtype)
        if index is None:
            return sub
        return (logits if owned else logits.clone()).index_copy_(0, index, sub)

    # ------------------------------------------------------------ drawing

    def _draw(self, logits: torch.Tensor, states: list[RequestState]) -> torch.Tensor:
        """One token per row (all non-greedy): temperature, min-p, top-k, top-p, inverse-CDF draw."""
        device, vocab = logits.device, logits.shape[1]
        params = [st.sampling for st in states]
        temps = torch.tensor([s.temperature for s in params], dtype=logits.dtype, device=device)[:, None]
        probs = torch.softmax(logits / temps, dim=-1)
        if any(s.min_p > 0.0 for s in params):
            min_p = torch.tensor([s.min_p for s in params], dtype=probs.dtype, device=device)[:, None]
            probs = probs.masked_fill(probs < probs.amax(dim=-1, keepdim=True) * min_p, 0.0)
        uniforms = self._uniforms(states)
        seeded = [s.seed is not None for s in params]
        top_k = [s.top_k if 0 < s.top_k < vocab else 0 for s in params]
        top_p = [s.top_p for s in params]

        # Rows by the window their support is drawn from: the whole vocabulary,
        # a top-k window (seeded rows: their own k; unseeded: the largest k), or
        # a top-p window grown until it holds top_p of the mass.
        full = [i for i in range(len(states)) if top_k[i] == 0 and top_p[i] >= 1.0]
        mass = [i for i in range(len(states)) if top_k[i] == 0 and top_p[i] < 1.0]
        unseeded_k = max((top_k[i] for i in range(len(states)) if top_k[i] and not seeded[i]), default=0)
        by_k: dict[int, list[int]] = {}
        for i in range(len(states)):
            if top_k[i]:
                by_k.setdefault(top_k[i] if seeded[i] else unseeded_k, []).append(i)

        groups: list[tuple[list[int], torch.Tensor, torch.Tensor | None]] = []
        if len(full) == len(states):
            groups.append((full, probs, None))
        elif full:
            groups.append((full, probs.index_select(0, _index(full, device)), None))
        for k, rows in by_k.items():
            weights, ids = torch.topk(probs.index_select(0, _index(rows, device)), k)
            groups.append((rows, weights, ids))
        if mass:
            groups.extend(_top_mass_windows(probs, mass, [top_p[i] for i in mass], [seeded[i] for i in mass]))

        if len(groups) == 1 and groups[0][0] == list(range(len(states))):
            rows, weights, ids = groups[0]
            return _inverse_cdf(weights, ids, [top_k[i] for i in rows], [top_p[i] for i in rows], [seeded[i] for i in rows], uniforms)
        tokens = torch.empty(len(states), dtype=torch.int64, device=device)
        for rows, weights, ids in groups:
            index = _index(rows, device)
            picked = _inverse_cdf(
                weights, ids, [top_k[i] for i in rows], [top_p[i] for i in rows], [seeded[i] for i in rows], uniforms[index]
            )
            tokens.index_copy_(0, index, picked)
        return tokens

    def _uniforms(self, states: list[RequestState]) -> torch.Tensor:
        """One uniform number per row, [rows, 1]: a seeded row's from its own generator, the rest in one draw."""
        seeded = [i for i, st in enumerate(states) if st.sampling.seed is not None]
        if not seeded:
            return torch.rand(len(states), 1, generator=self.generator, device=self.device)
        own = torch.cat([torch.rand(1, generator=self._generator_for(states[i]), device=self.device) for i in seeded])
        if len(seeded) == len(states):
            return own[:, None]
        out = torch.empty(len(states), dtype=own.dtype, device=self.device)
        out[_index(seeded, self.device)] = own
        rest = [i for i in range(len(states)) if states[i].sampling.seed is None]
        out[_index(rest, self.device)] = torch.rand(len(rest), generator=self.generator, device=self.device)
        return out[:, None]

    def _generator_for(self, state: RequestState) -> torch.Generator:
        if state.generator is None:
            state.generator = torch.Generator(device=self.device)
            state.generator.manual_seed(state.sampling.seed & 0xFFFF_FFFF_FFFF_FFFF)
        return state.generator


def _top_mass_windows(
    probs: torch.Tensor, rows: list[int], top_p: list[float], seeded: list[bool]
) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Top-p without top-k: for each row the smallest descending window of 64 * 4^j tokens
    holding top_p of its mass (sorting the whole vocabulary is rarely needed).

    Returns groups (rows, weights, ids), one per window size reached.
    """
    vocab, device = probs.shape[1], probs.device
    active = probs.index_select(0, _index(rows, device))
    targets = torch.tensor(top_p, dtype=probs.dtype, device=device) * _row_sums(active, seeded)
    groups = []
    k = _TOP_P_FIRST_WINDOW
    while rows:
        k = min(k, vocab)
        weights, ids = torch.topk(active, k)
        if k == vocab:
            groups.append((rows, weights, ids))
            break
        enough = (_row_sums(weights, seeded) >= targets).tolist()
        done = [j for j, ok in enumerate(enough) if ok]
        if done:
            keep = _index(done, device)
            groups.append(([rows[j] for j in done], weights.index_select(0, keep), ids.index_select(0, keep)))
            left = [j for j, ok in enumerate(enough) if not ok]
            if not left:
                break
            rest = _index(left, device)
            rows, seeded = [rows[j] for j in left], [seeded[j] for j in left]
            active, targets = active.index_select(0, rest), targets.index_select(0, rest)
        k *= 4
    return groups


def _inverse_cdf(
    weights: torch.Tensor,
    ids: torch.Tensor | None,
    top_k: list[int],
    top_p: list[float],
    seeded: list[bool],
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Token per row from descending (or vocabulary-order, ids None) weights.

    An unseeded row's top-k may be narrower than the window: its tail is zeroed.
    Top-p keeps the most likely tokens until the ones before a token already
    hold top_p of the window's mass (vLLM: drop the ascending-sorted tail whose
    cumulative mass is <= 1 - top_p). The draw: u * (mass kept) located in the
    cumulative weights.
    """
    rows, width = weights.shape
    device = weights.device
    keep = torch.full((rows, 1), width, dtype=torch.int64, device=device)
    if ids is not None and any(0 < k < width for k in top_k):
        limit = torch.tensor([k if 0 < k < width else width for k in top_k], dtype=torch.int64, device=device)[:, None]
        weights = weights.masked_fill(torch.arange(width, device=device) >= limit, 0.0)
        keep = limit
    cdf = torch.cumsum(weights, dim=-1)
    if any(p < 1.0 for p in top_p):
        p = torch.tensor(top_p, dtype=weights.dtype, device=device)[:, None]
        before = cdf - weights  # mass of the more likely tokens
        held = (before < p * _row_sums(weights, seeded)[:, None]).sum(dim=-1, keepdim=True).clamp(min=1)
        keep = torch.where(p < 1.0, torch.minimum(held, keep), keep)
    # cumsum runs row by row in order, so the first `keep` entries equal the
    # cumsum of the kept prefix, and the draw can stay on the device.
    u = uniforms * cdf.gather(1, keep - 1)
    pick = torch.minimum(torch.searchsorted(cdf, u, right=True), keep - 1)
    return (pick if ids is None else ids.gather(1, pick))[:, 0]


def _row_sums(weights: torch.Tensor, exact: list[bool]) -> torch.Tensor:
    """Per-row sums; rows in `exact` are summed alone, as one 1-D tensor, since
    torch may split a lone long row across threads (a different rounding) but
    never a row of a batch."""
    sums = weights.sum(dim=-1)
    for j, alone in enumerate(exact):
        if alone:
            sums[j] = weights[j].sum()
    return sums


# ------------------------------------------------------------ penalties


class PenaltyCounts:
    """Penalty bookkeeping for the requests with penalties: one row per request
    in two [requests, vocab] tables, output-token counts (frequency, presence)
    and seen flags (prompt or output: repetition), updated each step by one
    scatter of the tokens added since the last one.

    A request's row is taken on its first penalised step and given back when
    its RequestState is dropped (a preempted request comes back as a new state
    and recounts its tokens).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.vocab = 0
        self.counts = torch.zeros(0, 0, dtype=torch.int32, device=device)
        self.seen = torch.zeros(0, 0, dtype=torch.bool, device=device)
        self.free: list[int] = []

    @property
    def rows_in_use(self) -> int:
        return self.counts.shape[0] - len(self.free)

    def gather(self, states: list[RequestState], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(output counts int32, seen bool), [len(states), vocab], up to date with each state's tokens."""
        if vocab != self.vocab:
            self._reset(vocab)
        fresh = [st for st in states if st.penalty_row is None]
        if fresh:
            self._assign(fresh)
        seen_at, counted_at = [], []
        for st in states:
            known = len(st.token_ids)
            if st.counted == known:
                continue
            base = st.penalty_row * vocab
            new = np.asarray(st.token_ids[st.counted :], dtype=np.int64)
            seen_at.append(new[new < vocab] + base)
            outputs = new[max(st.num_prompt_tokens - st.counted, 0) :]
            counted_at.append(outputs[outputs < vocab] + base)
            st.counted = known
        if seen_at:
            flat = torch.as_tensor(np.concatenate(seen_at), device=self.device)
            self.seen.view(-1).index_fill_(0, flat, True)
            outs = torch.as_tensor(np.concatenate(counted_at), device=self.device)
            if outs.numel():
                ones = torch.ones(outs.numel(), dtype=torch.int32, device=self.device)
                self.counts.view(-1).index_put_((outs,), ones, accumulate=True)
        index = _index([st.penalty_row for st in states], self.device)
        return self.counts.index_select(0, index), self.seen.index_select(0, index)

    def _reset(self, vocab: int) -> None:
        self.vocab = vocab
        self.counts = torch.zeros(0, vocab, dtype=torch.int32, device=self.device)
        self.seen = torch.zeros(0, vocab, dtype=torch.bool, device=self.device)
        self.free = []

    def _assign(self, states: list[RequestState]) -> None:
        short = len(states) - len(self.free)
        if short > 0:
            size = self.counts.shape[0]
            grown = max(size * 2, size + short, 8)
            self.counts = torch.cat([self.counts, self.counts.new_zeros(grown - size, self.vocab)])
            self.seen = torch.cat([self.seen, self.seen.new_zeros(grown - size, self.vocab)])
            self.free.extend(range(grown - 1, size - 1, -1))
        rows = [self.free.pop() for _ in states]
        index = _index(rows, self.device)
        self.counts.index_fill_(0, index, 0)
        self.seen.index_fill_(0, index, False)
        for st, row in zip(states, rows):
            st.penalty_row, st.counted = row, 0
            weakref.finalize(st, self.free.append, row)


# ------------------------------------------------------------ results


def _to_host(logits: torch.Tensor, tokens: torch.Tensor, states: list[RequestState]) -> SampleOutput:
    """Tokens and the logprobs asked for, in one device-to-host copy.

    Logprobs are of the raw distribution (vLLM's default); the top ones come
    from one topk of the largest count asked for, cut per row on the host.
    """
    n, vocab = logits.shape
    wanted = [st.sampling.logprobs for st in states]
    if all(w < 0 for w in wanted):
        return SampleOutput(tokens.to(torch.int32).cpu().numpy(), None, None, None, None)
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, tokens[:, None])[:, 0]
    counts = np.array([min(max(w, 0), vocab) for w in wanted], dtype=np.int32)
    tops = np.flatnonzero(counts)
    width = int(counts.max())
    parts = [tokens.to(torch.int32), chosen.view(torch.int32)]
    if width:
        top_lps, top_ids = torch.topk(logprobs.index_select(0, torch.as_tensor(tops, device=logits.device)), width)
        parts += [top_ids.to(torch.int32).reshape(-1), top_lps.reshape(-1).view(torch.int32)]
    host = torch.cat(parts).cpu().numpy()
    out = SampleOutput(host[:n].copy(), host[n : 2 * n].view(np.float32).copy(), None, None, None)
    if not width:
        return out
    cut = (np.arange(width)[None, :] < counts[tops][:, None]).reshape(-1)
    block = len(tops) * width
    out.top_counts = counts
    out.top_ids = host[2 * n : 2 * n + block][cut]
    out.top_logprobs = host[2 * n + block :].view(np.float32)[cut]
    return out


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int64, device=device)
