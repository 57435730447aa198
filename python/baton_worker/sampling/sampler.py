"""Sampling on the worker, with vLLM semantics, batched over the step's rows.

Order per row: raw logprobs (for the response) from log_softmax of the raw
logits; allowed_token_ids (every other token to -inf) and logit_bias;
min_tokens suppression; repetition penalty (prompt + output tokens),
frequency and presence penalties (output tokens only); then greedy argmax when
temperature is 0, else temperature, min-p, top-k, top-p and an inverse-CDF draw
with one uniform number per row. A seeded row's number is a hash of its seed
and its output position (seeded_uniform), so a seeded request draws the same
tokens alone or in any batch, and after preemption and recompute; the other
rows share one draw from the sampler's generator.

Each stage is one tensor operation over all the rows that need it, done in
place in a scratch buffer kept from step to step (on CPU a fresh [rows, vocab]
tensor per stage costs more than the stage). The rows are laid out in the
buffer by what they need (penalised greedy rows, then the vocabulary-wide
draws, then one block per top-k window, then top-p-only rows), so every stage
works on a contiguous slice.

Vocabulary-wide argmax and draws work on blocks of VOCAB_BLOCK tokens: one
vectorised max or sum per block, then only the block that holds the answer is
searched (torch's CPU argmax and cumsum over 151,936 logits per row cost 10-20
times its max or sum). The argmax is torch.argmax's exactly (the first
maximal index).

A seeded request's tokens depend only on its seed, its output position and its
logits, never on its batch-mates: each row's arithmetic is the one the per-row
sampler does alone (softmax, block sums, cumsum and topk treat rows
independently; sums that torch may split across threads for a lone row are
taken row by row; seeded rows are grouped by their own top-k, since topk's
order among ties depends on k), while unseeded rows share one window of the
largest k.

The result leaves the device in one copy per step: token ids, their logprobs
and the top logprobs packed into one int32 tensor. launch() only queues that
copy (PendingSample), so a GPU worker can start the next step before it
reads the tokens.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..protocol import SamplingParams
from ..runtime.request_state import RequestState
from .token_bitmask import apply_token_bitmask

# Below this temperature a request is treated as greedy (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5

# First top-p window tried for rows without top-k; grown 4x until it holds top_p of the mass.
_TOP_P_FIRST_WINDOW = 64

# Tokens per block of the vocabulary-wide argmax and draw.
VOCAB_BLOCK = 1024

_MASK64 = 0xFFFF_FFFF_FFFF_FFFF
_GOLDEN_GAMMA = 0x9E37_79B9_7F4A_7C15


def _mix64(z: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit ints that spreads every input bit."""
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & _MASK64
    return z ^ (z >> 31)


def seeded_uniform(seed: int, position: int) -> float:
    """The uniform number in [0, 1) a seeded request draws its output token
    `position` (0: the first generated token) with: 24 bits (a float32's
    precision) of a hash of (seed mod 2**64, position). It depends on nothing
    else, so preemption, recompute and batch-mates cannot change it."""
    stream = _mix64(seed & _MASK64)
    return (_mix64((stream + (position + 1) * _GOLDEN_GAMMA) & _MASK64) >> 40) * 2.0**-24


@dataclass
class SampleOutput:
    token_ids: np.ndarray  # int32 [rows]
    logprobs: np.ndarray | None  # float32 [rows]
    top_counts: np.ndarray | None  # int32 [rows]
    top_ids: np.ndarray | None  # int32 [sum(top_counts)]
    top_logprobs: np.ndarray | None  # float32 [sum(top_counts)]


class PendingSample:
    """A step's sampled tokens on the device (tokens: int64 [rows], which the
    next step can read there) and their packed copy on its way to the host;
    read() waits for the copy and unpacks it."""

    def __init__(self, tokens: torch.Tensor | None, host: torch.Tensor | None, event, unpack: Callable[[np.ndarray], SampleOutput] | None,
                 out: SampleOutput | None = None):
        self.tokens, self.host, self.event, self.unpack, self.out = tokens, host, event, unpack, out

    @staticmethod
    def ready(out: SampleOutput) -> PendingSample:
        """Tokens already on the host (nothing on the device to wait for)."""
        return PendingSample(None, None, None, None, out)

    @staticmethod
    def copying(tokens: torch.Tensor, packed: torch.Tensor, unpack: Callable[[np.ndarray], SampleOutput]) -> PendingSample:
        if packed.device.type != "cuda":
            return PendingSample(tokens, packed, None, unpack)
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return PendingSample(tokens, host, event, unpack)

    def done(self) -> bool:
        return self.event is None or self.event.query()

    def read(self) -> SampleOutput:
        if self.out is None:
            if self.event is not None:
                self.event.synchronize()
            self.out = self.unpack(self.host.numpy())
        return self.out


@dataclass
class TokenMask:
    """Grammar masks of some sampled rows: rows index the logits' rows; bitmask is
    len(rows) packed rows of ceil(vocab / 32) int32 words (token_bitmask.py)."""

    rows: np.ndarray
    bitmask: np.ndarray


def is_greedy(state: RequestState) -> bool:
    return state.sampling.temperature < SAMPLING_EPS


def has_penalties(state: RequestState) -> bool:
    return penalizes(state.sampling)


def penalizes(s: SamplingParams) -> bool:
    """Repetition, frequency or presence penalties: the row's logits depend on its earlier tokens' values."""
    return s.repetition_penalty != 1.0 or s.frequency_penalty != 0.0 or s.presence_penalty != 0.0


def suppresses(state: RequestState) -> bool:
    s = state.sampling
    return state.num_output_tokens < s.min_tokens and len(s.suppress_token_ids) > 0


def biases(state: RequestState) -> bool:
    """allowed_token_ids or logit_bias: the request's logits change before it samples."""
    s = state.sampling
    return len(s.allowed_token_ids) > 0 or len(s.logit_bias_ids) > 0


def edits_logits(state: RequestState) -> bool:
    """Whether the raw logits are edited before the row samples (so a greedy row
    cannot take the plain argmax)."""
    return has_penalties(state) or suppresses(state) or biases(state)


@dataclass
class _Block:
    """Consecutive non-greedy rows of the scratch buffer drawn the same way."""

    kind: str  # "vocab": whole vocabulary; "top_k": a top-k window of `k`; "top_p": top-p without top-k
    k: int
    rows: list[int] = field(default_factory=list)  # indices into the step's states


class Sampler:
    def __init__(self, seed: int, device: torch.device):
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.penalty_counts = PenaltyCounts(device)
        self._scratch: torch.Tensor | None = None

    def sample(self, logits: torch.Tensor, states: list[RequestState], token_mask: TokenMask | None = None) -> SampleOutput:
        return self.launch(logits, states, token_mask).read()

    def launch(self, logits: torch.Tensor, states: list[RequestState], token_mask: TokenMask | None = None) -> PendingSample:
        """Queues the sampling of every row on the logits' device and the copy of
        the result to the host; read() waits for it.

        logits: float32 [rows, vocab], one row per request that samples this step (left
        unchanged, but for grammar-masked rows: token_mask's disallowed tokens become -inf
        first, so sampling and logprobs see only what the grammar allows)."""
        n = len(states)
        if n == 0:
            return PendingSample.ready(SampleOutput(np.zeros(0, np.int32), None, None, None, None))
        if token_mask is not None:
            apply_token_bitmask(logits, token_mask.rows, token_mask.bitmask)
        greedy, hot = [], []  # greedy rows whose logits are edited; the rows that are not greedy
        for i, st in enumerate(states):
            if not is_greedy(st):
                hot.append(i)
            elif edits_logits(st):
                greedy.append(i)
        if greedy or hot:
            tokens = self._sample_processed(logits, states, greedy, hot)
        else:
            tokens = first_argmax(logits)
        return self._pack(logits, tokens, states)

    def _scratch_rows(self, rows: int, like: torch.Tensor) -> torch.Tensor:
        """[rows, vocab] of the step's scratch buffer (kept between steps, grown 32 rows at a time)."""
        buf, vocab = self._scratch, like.shape[1]
        if buf is None or buf.shape[0] < rows or buf.shape[1] != vocab or buf.dtype != like.dtype:
            size = 8 if rows <= 8 else -(-rows // 32) * 32
            self._scratch = None  # let the old one go first
            self._scratch = buf = torch.empty(size, vocab, dtype=like.dtype, device=self.device)
        return buf[:rows]

    # ------------------------------------------------------------ processing

    def _sample_processed(self, logits: torch.Tensor, states: list[RequestState], greedy: list[int], hot: list[int]) -> torch.Tensor:
        n, vocab = logits.shape
        device = logits.device
        blocks = _blocks([states[i] for i in hot], hot, vocab)
        order = greedy + [i for b in blocks for i in b.rows]
        laid = [states[i] for i in order]
        identity = len(order) == n and order == list(range(n))
        work = self._scratch_rows(len(order), logits)
        edits = any(edits_logits(st) for st in laid)
        hot_temps = [states[i].sampling.temperature for i in order[len(greedy) :]]
        temps = _on(hot_temps, logits.dtype, device)
        unit = all(t == 1.0 for t in hot_temps)  # x / 1.0 == x: no division to do
        divided = identity and not edits and not greedy
        if divided and unit:
            torch.softmax(logits, dim=-1, out=work)
        elif divided:
            torch.div(logits, temps[:, None], out=work)
        elif identity:
            work.copy_(logits)
        else:
            torch.index_select(logits, 0, _index(order, device), out=work)
        if edits:
            _allow_and_bias(work, laid)
            _suppress(work, laid)
            self.penalty_counts.apply(work, laid)

        picked = torch.empty(len(order), dtype=torch.int64, device=device)
        g = len(greedy)
        if g:
            picked[:g] = first_argmax(work[:g])
        if hot:
            probs = work[g:]
            if not divided and not unit:
                probs.div_(temps[:, None])
            if not (divided and unit):
                torch.softmax(probs, dim=-1, out=probs)
            params = [st.sampling for st in laid[g:]]
            if any(s.min_p > 0.0 for s in params):
                min_p = _on([s.min_p for s in params], probs.dtype, device)[:, None]
                probs.masked_fill_(probs < probs.amax(dim=-1, keepdim=True) * min_p, 0.0)
            picked[g:] = self._draw(probs, laid[g:], blocks)

        if identity:
            return picked
        tokens = torch.empty(n, dtype=torch.int64, device=device)
        plain = n - len(order)
        if plain:
            done = set(order)
            rest = [i for i in range(n) if i not in done]
            if 2 * plain >= n:
                tokens = first_argmax(logits)
            else:
                tokens.index_copy_(0, _index(rest, device), first_argmax(logits.index_select(0, _index(rest, device))))
        return tokens.index_copy_(0, _index(order, device), picked)

    # ------------------------------------------------------------ drawing

    def _draw(self, probs: torch.Tensor, states: list[RequestState], blocks: list[_Block]) -> torch.Tensor:
        """One token per row of probs (laid out block after block); probs is used up."""
        uniforms = self._uniforms(states)
        tokens = torch.empty(len(states), dtype=torch.int64, device=probs.device)
        start = 0
        for block in blocks:
            end = start + len(block.rows)
            sub = states[start:end]
            seeded = [st.sampling.seed is not None for st in sub]
            top_p = [st.sampling.top_p for st in sub]
            rows, u = probs[start:end], uniforms[start:end]
            if block.kind == "vocab":
                tokens[start:end] = inverse_cdf(rows, u)
            elif block.kind == "top_k":
                weights, ids = torch.topk(rows, block.k)
                top_k = [st.sampling.top_k for st in sub]
                tokens[start:end] = _draw_window(weights, ids, top_k, top_p, seeded, u)
            else:
                for where, weights, ids in _top_p_windows(rows, top_p, seeded):
                    at = _index(where, probs.device)
                    drawn = _draw_window(weights, ids, [0] * len(where), [top_p[j] for j in where], [seeded[j] for j in where], u[at])
                    tokens[start + at] = drawn
            start = end
        return tokens

    def _uniforms(self, states: list[RequestState]) -> torch.Tensor:
        """One uniform number per row, [rows, 1]: a seeded row's from its seed and
        output position, the rest in one draw from the sampler's generator."""
        seeded = [i for i, st in enumerate(states) if st.sampling.seed is not None]
        if not seeded:
            return torch.rand(len(states), 1, generator=self.generator, device=self.device)
        own = _on([seeded_uniform(states[i].sampling.seed, states[i].num_output_tokens) for i in seeded], torch.float32, self.device)
        if len(seeded) == len(states):
            return own[:, None]
        out = torch.empty(len(states), dtype=own.dtype, device=self.device)
        out[_index(seeded, self.device)] = own
        rest = [i for i in range(len(states)) if states[i].sampling.seed is None]
        out[_index(rest, self.device)] = torch.rand(len(rest), generator=self.generator, device=self.device)
        return out[:, None]

    # ------------------------------------------------------------ results

    def _pack(self, logits: torch.Tensor, tokens: torch.Tensor, states: list[RequestState]) -> PendingSample:
        """Tokens and the logprobs asked for, packed into one int32 tensor whose
        copy to the host is queued: one device-to-host copy per step.

        Logprobs are of the raw distribution (vLLM's default); the top ones come
        from one topk of the largest count asked for, cut per row on the host.
        """
        n, vocab = logits.shape
        wanted = [st.sampling.logprobs for st in states]
        if all(w < 0 for w in wanted):
            return PendingSample.copying(tokens, tokens.to(torch.int32), lambda host: SampleOutput(host.copy(), None, None, None, None))
        counts = np.array([min(max(w, 0), vocab) for w in wanted], dtype=np.int32)
        tops = np.flatnonzero(counts).tolist()
        width = int(counts.max())
        # Rows with top logprobs first, so the topk reads one slice.
        order = tops + [i for i in range(n) if counts[i] == 0] if 0 < len(tops) < n else None
        logprobs = self._scratch_rows(n, logits)
        if order is None:
            torch.log_softmax(logits, dim=-1, out=logprobs)
            chosen = logprobs.gather(1, tokens[:, None])[:, 0]
        else:
            index = _index(order, logits.device)
            torch.index_select(logits, 0, index, out=logprobs)
            torch.log_softmax(logprobs, dim=-1, out=logprobs)
            chosen = torch.empty(n, dtype=logprobs.dtype, device=logits.device)
            chosen[index] = logprobs.gather(1, tokens[index][:, None])[:, 0]
        parts = [tokens.to(torch.int32), chosen.to(torch.float32).view(torch.int32)]
        if width:
            top_lps, top_ids = torch.topk(logprobs[: len(tops)], width)
            parts += [top_ids.to(torch.int32).reshape(-1), top_lps.to(torch.float32).reshape(-1).view(torch.int32)]

        def unpack(host: np.ndarray) -> SampleOutput:
            out = SampleOutput(host[:n].copy(), host[n : 2 * n].view(np.float32).copy(), None, None, None)
            if not width:
                return out
            cut = (np.arange(width)[None, :] < counts[tops][:, None]).reshape(-1)
            block = len(tops) * width
            out.top_counts = counts
            out.top_ids = host[2 * n : 2 * n + block][cut]
            out.top_logprobs = host[2 * n + block :].view(np.float32)[cut]
            return out

        return PendingSample.copying(tokens, torch.cat(parts), unpack)


def _blocks(states: list[RequestState], rows: list[int], vocab: int) -> list[_Block]:
    """The non-greedy rows by how they are drawn: the whole vocabulary, a top-k
    window (a seeded row's own k; unseeded rows share the largest), or top-p alone."""
    whole = _Block("vocab", 0)
    top_p_only = _Block("top_p", 0)
    unseeded_k = max((st.sampling.top_k for st in states if 0 < st.sampling.top_k < vocab and st.sampling.seed is None), default=0)
    by_k: dict[int, _Block] = {}
    for i, st in zip(rows, states):
        s = st.sampling
        if 0 < s.top_k < vocab:
            k = s.top_k if s.seed is not None else unseeded_k
            by_k.setdefault(k, _Block("top_k", k)).rows.append(i)
        elif s.top_p < 1.0:
            top_p_only.rows.append(i)
        else:
            whole.rows.append(i)
    return [b for b in [whole, *by_k.values(), top_p_only] if b.rows]


def _top_p_windows(
    probs: torch.Tensor, top_p: list[float], seeded: list[bool]
) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Top-p without top-k: for each row the smallest descending window of 64 * 4^j tokens
    holding top_p of its mass (sorting the whole vocabulary is rarely needed).

    Returns (rows of probs, weights, ids), one per window size reached.
    """
    vocab, device = probs.shape[1], probs.device
    rows = list(range(probs.shape[0]))
    active = probs
    targets = _on(top_p, probs.dtype, device) * _row_sums(active, seeded)
    windows = []
    k = _TOP_P_FIRST_WINDOW
    while rows:
        k = min(k, vocab)
        weights, ids = torch.topk(active, k)
        if k == vocab:
            windows.append((rows, weights, ids))
            break
        enough = (_row_sums(weights, seeded) >= targets).tolist()
        done = [j for j, ok in enumerate(enough) if ok]
        if len(done) == len(rows):
            windows.append((rows, weights, ids))
            break
        if done:
            keep = _index(done, device)
            windows.append(([rows[j] for j in done], weights[keep], ids[keep]))
            left = [j for j, ok in enumerate(enough) if not ok]
            rest = _index(left, device)
            rows, seeded = [rows[j] for j in left], [seeded[j] for j in left]
            active, targets = active[rest], targets[rest]
        k *= 4
    return windows


def _draw_window(
    weights: torch.Tensor,
    ids: torch.Tensor,
    top_k: list[int],
    top_p: list[float],
    seeded: list[bool],
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Token per row from a descending window of weights.

    An unseeded row's top-k may be narrower than the window: its tail is zeroed.
    Top-p keeps the most likely tokens until the ones before a token already
    hold top_p of the window's mass (vLLM: drop the ascending-sorted tail whose
    cumulative mass is <= 1 - top_p).
    """
    rows, width = weights.shape
    device = weights.device
    keep = torch.full((rows, 1), width, dtype=torch.int64, device=device)
    if any(0 < k < width for k in top_k):
        keep = _on([k if 0 < k < width else width for k in top_k], torch.int64, device)[:, None]
        weights = weights.masked_fill(torch.arange(width, device=device) >= keep, 0.0)
    cdf = torch.cumsum(weights, dim=-1)
    if any(p < 1.0 for p in top_p):
        p = _on(top_p, weights.dtype, device)[:, None]
        before = cdf - weights  # mass of the more likely tokens
        held = (before < p * _row_sums(weights, seeded)[:, None]).sum(dim=-1, keepdim=True).clamp(min=1)
        keep = torch.where(p < 1.0, torch.minimum(held, keep), keep)
    return _locate(cdf, ids, keep, uniforms)


def _locate(cdf: torch.Tensor, ids: torch.Tensor | None, keep: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The inverse-CDF draw over each row's first `keep` entries: u * (mass kept)
    located in the cumulative weights. cumsum runs along a row in order, so its
    first `keep` entries are the cumsum of the kept prefix alone."""
    u = _below(uniforms * cdf.gather(1, keep - 1), cdf.gather(1, keep - 1))
    pick = torch.minimum(torch.searchsorted(cdf, u, right=True), keep - 1)
    return (pick if ids is None else ids.gather(1, pick))[:, 0]


def _below(target: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """target, kept below total: searchsorted(right=True) never stops on a
    zero-weight token before the total, but at the total it would run off the
    end (a uniform generator that can return 1.0 would get there)."""
    return torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))


def block_reduce(x: torch.Tensor, reduce, block: int = VOCAB_BLOCK) -> torch.Tensor:
    """[rows, blocks]: `reduce` (torch.amax or torch.sum) over each `block`
    tokens of each row, the last block possibly shorter."""
    rows, vocab = x.shape
    full = vocab // block * block
    parts = []
    if full:
        parts.append(reduce(x[:, :full].view(rows, full // block, block), -1))
    if full < vocab:
        parts.append(reduce(x[:, full:], -1, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _block_columns(block: torch.Tensor, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of each row's block ([rows, VOCAB_BLOCK], clamped to the
    vocabulary) and which of them are real (the last block may be shorter)."""
    cols = block[:, None] * VOCAB_BLOCK + torch.arange(VOCAB_BLOCK, device=block.device)
    return cols.clamp(max=vocab - 1), cols < vocab


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) of a [rows, vocab] tensor whose rows are contiguous:
    the first maximal index (NaN counts as maximal), from the block maxima."""
    rows, vocab = x.shape
    if vocab <= 2 * VOCAB_BLOCK or x.device.type != "cpu":
        # The blocks pay off on CPU only: a GPU's argmax is one kernel over the row.
        return torch.argmax(x, dim=-1)
    block = torch.argmax(block_reduce(x, torch.amax), dim=-1)  # the first block holding the row's maximum
    cols, _real = _block_columns(block, vocab)
    # A clamped column repeats the last token after it, so the first maximum is a real one.
    return cols.gather(1, torch.argmax(x.gather(1, cols), dim=-1, keepdim=True))[:, 0]


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of non-negative weights [rows, vocab] (rows contiguous,
    any scale): the token whose cumulative weight first exceeds u * total, for
    uniforms u [rows, 1] in [0, 1). The mass before a token is summed block by
    block (block sums, their cumsum, then the cumsum inside the one block the
    target falls in), never along the whole row."""
    rows, vocab = weights.shape
    cum = torch.cumsum(block_reduce(weights, torch.sum), dim=-1)
    total = cum[:, -1:]
    target = _below(uniforms * total, total)
    block = torch.searchsorted(cum, target, right=True).clamp_(max=cum.shape[1] - 1)
    before = torch.where(block > 0, cum.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(target))
    cols, real = _block_columns(block[:, 0], vocab)
    inside = weights.gather(1, cols).masked_fill_(~real, 0.0)
    # The last token with weight bounds the pick, should the two sums round apart.
    keep = ((inside > 0) * torch.arange(1, VOCAB_BLOCK + 1, device=weights.device)).amax(dim=-1, keepdim=True).clamp_(min=1)
    pick = torch.minimum(torch.searchsorted(torch.cumsum(inside, dim=-1), target - before, right=True), keep - 1)
    return cols.gather(1, pick)[:, 0]


def _row_sums(weights: torch.Tensor, exact: list[bool]) -> torch.Tensor:
    """Per-row sums; rows in `exact` are summed alone, as one 1-D tensor, since
    torch may split a lone long row across threads (a different rounding) but
    never a row of a batch."""
    sums = weights.sum(dim=-1)
    for j, alone in enumerate(exact):
        if alone:
            sums[j] = weights[j].sum()
    return sums


def _allow_and_bias(work: torch.Tensor, states: list[RequestState]) -> None:
    """allowed_token_ids: every other token of the row gets -inf; logit_bias: each
    bias is added to its token's logit (one index_add_ over the rows that have one)."""
    vocab = work.shape[1]
    flat, added = [], []
    for i, st in enumerate(states):
        s = st.sampling
        if len(s.allowed_token_ids):
            ids = np.asarray(s.allowed_token_ids, dtype=np.int64)
            ids = torch.as_tensor(ids[ids < vocab], device=work.device)
            row = work[i]
            kept = row.index_select(0, ids)
            row.fill_(float("-inf")).index_copy_(0, ids, kept)
        if len(s.logit_bias_ids):
            ids = np.asarray(s.logit_bias_ids, dtype=np.int64)
            inside = ids < vocab
            flat.append(ids[inside] + i * vocab)
            added.append(np.asarray(s.logit_bias_values, dtype=np.float32)[inside])
    if flat:
        values = torch.as_tensor(np.concatenate(added), device=work.device).to(work.dtype)
        work.view(-1).index_add_(0, torch.as_tensor(np.concatenate(flat), device=work.device), values)


def _suppress(work: torch.Tensor, states: list[RequestState]) -> None:
    """min_tokens: the stop tokens get -inf until enough tokens are out."""
    vocab = work.shape[1]
    flat = []
    for i, st in enumerate(states):
        if suppresses(st):
            ids = np.asarray(st.sampling.suppress_token_ids, dtype=np.int64)
            flat.append(ids[ids < vocab] + i * vocab)
    if flat:
        work.view(-1).index_fill_(0, torch.as_tensor(np.concatenate(flat), device=work.device), float("-inf"))


# ------------------------------------------------------------ penalties


@dataclass
class PenaltyBooks:
    """What one request's penalties need: the distinct tokens of its prompt and
    output (repetition) and its row in the output-count table (frequency,
    presence)."""

    count_row: int | None  # None: no frequency or presence penalty
    seen: np.ndarray  # int64, distinct token ids in first-seen order
    seen_set: set[int]
    counted: int = 0  # tokens of token_ids already accounted for


class PenaltyCounts:
    """Penalty bookkeeping for the requests with penalties.

    Output-token counts live in one [requests, vocab] int32 table, one row per
    request, updated each step by one scatter-add of every row's new output
    tokens. Penalties change only the logits of tokens a request has seen, so
    they are applied at those positions alone (the same arithmetic per logit
    as a vocabulary-wide pass, none of its cost).

    A request's table row is taken on its first penalised step and given back
    when its RequestState is dropped (a preempted request comes back as a new
    state and recounts its tokens).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.vocab = 0
        self.counts = torch.zeros(0, 0, dtype=torch.int32, device=device)
        self.free: list[int] = []

    @property
    def rows_in_use(self) -> int:
        return self.counts.shape[0] - len(self.free)

    def apply(self, work: torch.Tensor, states: list[RequestState]) -> None:
        """Penalises work (raw logits, row i for states[i]) in place."""
        vocab = work.shape[1]
        rows = [i for i, st in enumerate(states) if has_penalties(st)]
        if not rows:
            return
        self._update([states[i] for i in rows], vocab)
        books = [states[i].penalties for i in rows]
        params = [states[i].sampling for i in rows]
        sizes = [len(b.seen) for b in books]
        if not sum(sizes):
            return
        at = torch.as_tensor(np.concatenate([b.seen + i * vocab for i, b in zip(rows, books)]), device=work.device)
        flat = work.view(-1)
        logit = flat[at]

        def per_token(values: list[float]) -> torch.Tensor:
            return torch.as_tensor(np.repeat(np.asarray(values, dtype=np.float32), sizes), device=work.device).to(work.dtype)

        if any(s.repetition_penalty != 1.0 for s in params):
            rep = per_token([s.repetition_penalty for s in params])
            logit = torch.where(logit > 0, logit / rep, logit * rep)
        if any(s.frequency_penalty != 0.0 or s.presence_penalty != 0.0 for s in params):
            # Rows without a count row have no frequency or presence penalty: they read row 0, times 0.
            table = np.concatenate([b.seen + (b.count_row or 0) * vocab for b in books])
            counts = self.counts.view(-1)[torch.as_tensor(table, device=work.device)].to(work.dtype)
            freq, pres = per_token([s.frequency_penalty for s in params]), per_token([s.presence_penalty for s in params])
            logit = logit - freq * counts - pres * (counts > 0).to(work.dtype)
        flat[at] = logit

    def output_counts(self, state: RequestState) -> torch.Tensor:
        """The request's output-token counts (int32 [vocab]); zeros when it has no row."""
        books = state.penalties
        if books is None or books.count_row is None:
            return torch.zeros(self.vocab, dtype=torch.int32, device=self.device)
        return self.counts[books.count_row]

    def _update(self, states: list[RequestState], vocab: int) -> None:
        if vocab != self.vocab:
            if self.vocab:
                raise ValueError(f"vocabulary changed from {self.vocab} to {vocab}")
            self.vocab = vocab
            self.counts = torch.zeros(0, vocab, dtype=torch.int32, device=self.device)
        fresh = [st for st in states if st.penalties is None]
        if fresh:
            self._start(fresh)
        scatter = []
        for st in states:
            books = st.penalties
            known = len(st.token_ids)
            if books.counted == known:
                continue
            new = np.asarray(st.token_ids[books.counted :], dtype=np.int64)
            outputs = new[max(st.num_prompt_tokens - books.counted, 0) :]
            books.counted = known
            unseen = []
            for t in new[new < vocab].tolist():
                if t not in books.seen_set:
                    books.seen_set.add(t)
                    unseen.append(t)
            if unseen:
                books.seen = np.concatenate([books.seen, np.asarray(unseen, dtype=np.int64)])
            if books.count_row is not None and len(outputs):
                scatter.append(outputs[outputs < vocab] + books.count_row * vocab)
        if scatter:
            at = torch.as_tensor(np.concatenate(scatter), device=self.device)
            self.counts.view(-1).index_put_((at,), torch.ones(len(at), dtype=torch.int32, device=self.device), accumulate=True)

    def _start(self, states: list[RequestState]) -> None:
        counted = [st.sampling.frequency_penalty != 0.0 or st.sampling.presence_penalty != 0.0 for st in states]
        short = sum(counted) - len(self.free)
        if short > 0:
            size = self.counts.shape[0]
            grown = max(size * 2, size + short, 8)
            self.counts = torch.cat([self.counts, self.counts.new_zeros(grown - size, self.vocab)])
            self.free.extend(range(grown - 1, size - 1, -1))
        for st, needs_row in zip(states, counted):
            row = None
            if needs_row:
                row = self.free.pop()
                self.counts[row].zero_()
                weakref.finalize(st, self.free.append, row)
            st.penalties = PenaltyBooks(row, np.zeros(0, np.int64), set())


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return _on(rows, torch.int64, device)


def _on(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small host list on the device without waiting for the device: torch.tensor(..., device=cuda)
    copies synchronously, which would stall the host until every queued kernel has run."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)
