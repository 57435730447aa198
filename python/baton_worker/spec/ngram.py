"""N-gram prompt lookup (vLLM's `ngram` speculative method): draft tokens
copied from earlier in the request's own token list.

For n from prompt_lookup_max down to prompt_lookup_min, the sequence's last n
tokens are looked up earlier in the sequence (the suffix itself does not
count); the first n with a match wins, its most recent earlier occurrence is
used, and the num_speculative_tokens tokens that follow that occurrence are
the drafts. Where the sequence ends before k tokens follow, the copy runs on
over its own drafts (an overlapping copy, as LZ77 decodes one): the match says
the sequence repeats with period length - start, so a run of one token drafts
k more of it and a cycle shorter than k drafts its next k tokens, where a copy
that stops at the end would draft fewer.

Vectorized: one comparison over the sequence finds the earlier occurrences of
the last token; each candidate's match length is then extended backwards one
offset at a time (at most prompt_lookup_max offsets, each over the candidates
only), so the work per call is O(length + candidates * max_n).
"""

from __future__ import annotations

import numpy as np

_EMPTY = np.zeros(0, np.int32)


def propose_ngram(tokens: np.ndarray, k: int, min_n: int, max_n: int) -> np.ndarray:
    """Up to k draft tokens for the sequence `tokens` (int array), int32; empty when nothing matches."""
    length = len(tokens)
    if k <= 0 or length < 2 or max_n < min_n:
        return _EMPTY
    # Earlier positions e (e <= length - 2) holding the sequence's last token: candidate ends of a match.
    ends = np.flatnonzero(tokens[: length - 1] == tokens[length - 1])
    if not len(ends):
        return _EMPTY
    # Matched length of each candidate, up to max_n, counted backwards from its end.
    matched = np.ones(len(ends), np.int64)
    alive = np.ones(len(ends), bool)
    for j in range(1, max_n):
        if j > length - 1:
            break
        at = ends - j
        ok = alive & (at >= 0)
        ok[ok] = tokens[at[ok]] == tokens[length - 1 - j]
        matched += ok
        alive = ok
        if not alive.any():
            break
    for n in range(max_n, min_n - 1, -1):
        hit = np.flatnonzero(matched >= n)
        if len(hit):
            start = int(ends[hit[-1]]) + 1  # the most recent occurrence: ends are increasing
            period = length - start
            return np.asarray(tokens[start + np.arange(k) % period], np.int32)
    return _EMPTY


class NgramProposer:
    """The worker's proposer: --num-speculative-tokens K, --prompt-lookup-min / --prompt-lookup-max."""

    def __init__(self, k: int, min_n: int, max_n: int):
        if k < 1 or min_n < 1 or max_n < min_n:
            raise ValueError(f"bad n-gram proposer settings k={k} min={min_n} max={max_n}")
        self.k = k
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, tokens: np.ndarray) -> np.ndarray:
        return propose_ngram(tokens, self.k, self.min_n, self.max_n)

    def propose_rows(self, slots: list[int], tokens: list[np.ndarray]) -> list[np.ndarray]:
        """The proposers' one interface (spec/draft_model.py has the other): drafts for each row's known tokens."""
        return [self.propose(t) for t in tokens]

    def release(self, slot: int) -> None:
        """Keeps nothing per request."""
