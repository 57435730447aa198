"""The vocabulary projection screened in bfloat16, decided exactly in float32.

On CPU the head ([rows, hidden] x [hidden, vocab]) is most of a small model's
step, and a plain request (greedy, or temperature alone with no seed) needs
only a few of its logits exactly: the ones near the top. So the screen
multiplies in bfloat16 (twice the float32 rate on a CPU with AVX512-BF16 or
AMX), bounds how far each approximate logit can be from the float32 one, and
computes exactly in float32 only the tokens the bound cannot rule out.

The bound. With u = 2^-8 (bfloat16's unit roundoff), both factors rounded to
bfloat16, products accumulated in float32 and the sum rounded to bfloat16, and
the float32 reference accumulated in some order of its own:
    |approx_v - logit_v| <= (3u + 4u^2 + 3 g_H) * sum_i |x_i w_vi|
                         <= (3u + 4u^2 + 3 g_H) * |x|_2 * max_v |w_v|_2 = b
(g_H = H 2^-24 / (1 - H 2^-24), Cauchy-Schwarz for the last step), one number
per row. The tokens whose approximate logit is within 2b of the row's top hold
the float32 argmax; they are rescored in float32 and the first maximum wins,
as torch.argmax's does.

Sampling at temperature T is exact rejection sampling from a proposal that
covers the softmax of the float32 logits: candidates (approximate logit
within 2b + T * TAIL_MARGIN of the top) with their exact weights
exp((logit - top) / T), and for the tokens below that, per block of
SCREEN_BLOCK tokens, the envelope exp((min(block max, cut) + b - top) / T)
each. One uniform number walks the proposal's cumulative mass: a candidate is
taken as is; a tail token is kept with probability (its exact weight) /
(its envelope). A row whose candidates hold less than MIN_CANDIDATE_MASS of
the proposal, or whose tail token is refused, is left to the exact path,
which draws it afresh: rejection sampling's accepted token does not depend on
the round it was accepted in, so the fallback keeps the distribution exact.

Seeded rows, edited logits (penalties, biases, min_tokens, grammars), top-k,
top-p, min-p and logprobs all need the whole float32 row: those rows take the
exact path (step_runner.py splits the step).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .request_state import RequestState
from .sampler import edits_logits, is_greedy

# Tokens per block of the screen's block maxima (a [rows, vocab / 64] table is
# cheap to scan; smaller blocks make the tail envelope tighter).
SCREEN_BLOCK = 64
# How far below the top (in units of temperature) a sampled row's candidates
# reach: a tail token's envelope is at most e^-13 of the top token's weight
# (measured on the 19.7M Llama at temperature 1: 10 left 2-4% of rows to the
# exact path, 13 none, and more candidates cost more rescoring).
TAIL_MARGIN = 13.0
# A sampled row is screened only when its candidates hold this share of the
# proposal's mass (else most of its draws would fall in the tail).
MIN_CANDIDATE_MASS = 0.9
_UNIT_ROUNDOFF = 2.0**-8


def screens(state: RequestState, vocab: int) -> bool:
    """Whether a row's token can be decided by the screen: greedy, or temperature
    alone with no seed, and no logprobs or logit edits."""
    s = state.sampling
    if s.logprobs >= 0 or edits_logits(state):
        return False
    if is_greedy(state):
        return True
    return s.seed is None and not (0 < s.top_k < vocab) and s.top_p >= 1.0 and s.min_p <= 0.0


def bf16_matmul_is_native() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (elsewhere oneDNN emulates
    it, slower than float32)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return False
    words = set(flags.split())
    return "avx512_bf16" in words or "amx_bf16" in words


class HeadScreen:
    """weight: the float32 head [vocab, hidden], kept (not copied) for the exact rescoring."""

    def __init__(self, weight: torch.Tensor, rows_hint: int = 32, margin: float = TAIL_MARGIN, min_mass: float = MIN_CANDIDATE_MASS):
        self.vocab, hidden = weight.shape
        self.margin, self.min_mass = margin, min_mass
        self.weight = weight
        # Padded to whole blocks with zero rows; their logits become -inf before the screen reads them.
        self.padded = -(-self.vocab // SCREEN_BLOCK) * SCREEN_BLOCK
        bf16 = torch.zeros(self.padded, hidden, dtype=torch.bfloat16)
        bf16[: self.vocab] = weight
        self.packed = torch.ops.mkldnn._reorder_linear_weight(bf16, rows_hint)
        self._scratch: torch.Tensor | None = None  # float32 logits, kept between steps (a fresh one costs more than filling it)
        g = hidden * 2.0**-24 / (1 - hidden * 2.0**-24)
        # 1.001: the row norms themselves are float32 sums.
        self.slack = (3 * _UNIT_ROUNDOFF + 4 * _UNIT_ROUNDOFF**2 + 3 * g) * weight.norm(dim=1).max().item() * 1.001

    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()

    def bounds(self, x: torch.Tensor) -> torch.Tensor:
        """b per row: how far an approximate logit can be from the float32 one."""
        return x.norm(dim=1) * self.slack

    @torch.inference_mode()
    def approximate(self, x: torch.Tensor) -> torch.Tensor:
        """float32 [rows, padded]: the screen's logits, -inf past the vocabulary."""
        approx = torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.packed, None, "none", [], "")
        rows = x.shape[0]
        if self._scratch is None or self._scratch.shape[0] < rows:
            self._scratch = None
            self._scratch = torch.empty(max(rows, 32), self.padded)
        out = self._scratch[:rows]
        out.copy_(approx)
        if self.padded > self.vocab:
            out[:, self.vocab :] = float("-inf")
        return out

    @torch.inference_mode()
    def sample(self, x: torch.Tensor, temperatures: list[float], generator: torch.Generator) -> np.ndarray:
        """x: float32 head input [rows, hidden] (after the final norm); temperatures:
        0 for a greedy row. Returns int64 [rows]: each row's token, or -1 where the
        exact path must decide."""
        rows, vocab = x.shape[0], self.vocab
        approx = self.approximate(x)
        blocks = approx.view(-1, SCREEN_BLOCK)  # row r's block j is blocks[r * per_row + j]
        per_row = self.padded // SCREEN_BLOCK
        block_max = blocks.amax(dim=1).view(rows, per_row)
        top = block_max.amax(dim=1)
        bound = self.bounds(x)
        temps = torch.tensor(temperatures, dtype=torch.float32)
        cut = top - 2 * bound - temps * self.margin  # candidates: approx >= cut

        # Candidates: the tokens >= cut inside the blocks whose maximum reaches it.
        hit = (block_max >= cut[:, None]).nonzero()
        hit_rows = hit[:, 0]
        inside = blocks.index_select(0, hit_rows * per_row + hit[:, 1]) >= cut[hit_rows][:, None]
        at = inside.nonzero()
        cand_rows = hit_rows[at[:, 0]]  # sorted by row, then token
        cand_cols = hit[at[:, 0], 1] * SCREEN_BLOCK + at[:, 1]
        exact = (self.weight.index_select(0, cand_cols) * x.index_select(0, cand_rows)).sum(dim=1)

        best = torch.full((rows,), float("-inf")).scatter_reduce(0, cand_rows, exact, "amax")
        tokens = np.full(rows, -1, dtype=np.int64)
        greedy = [i for i, t in enumerate(temperatures) if t == 0.0]
        if greedy:
            is_best = exact == best[cand_rows]
            first = torch.full((rows,), vocab, dtype=torch.int64).scatter_reduce(0, cand_rows[is_best], cand_cols[is_best], "amin")
            picked = first.numpy()
            for i in greedy:
                if picked[i] < vocab:  # else NaN or inf in the row: the exact path decides
                    tokens[i] = picked[i]
        if len(greedy) < rows:
            self._draw(tokens, approx, block_max, cut, bound, best, temps, cand_rows, cand_cols, exact, x, generator)
        return tokens

    def _draw(self, tokens, approx, block_max, cut, bound, best, temps, cand_rows, cand_cols, exact, x, generator) -> None:
        """Rejection sampling for the rows with temperature > 0 (module docstring)."""
        rows = approx.shape[0]
        if len(exact) == 0:
            return
        t = temps.clamp(min=1e-30).double()
        top, b = best.double(), bound.double()
        # Candidates' exact weights; a row with a non-finite one is left to the exact path
        # (zeroed here, so the cumulative sum over all rows stays finite).
        weight = torch.exp((exact.double() - top[cand_rows]) / t[cand_rows])
        finite = torch.isfinite(weight)
        broken = torch.bincount(cand_rows[~finite], minlength=rows) > 0
        weight = torch.where(finite, weight, 0.0)
        cum = torch.cumsum(weight, 0)  # row after row, each row's candidates in token order
        counts = torch.bincount(cand_rows, minlength=rows)
        ends = torch.cumsum(counts, 0)
        first, last = (ends - counts).clamp(max=len(cum) - 1), (ends - 1).clamp(min=0)
        base = cum[first] - weight[first]  # the mass before the row's first candidate
        held = torch.where(counts > 0, cum[last] - base, 0.0)
        # The tail's envelope per block.
        sizes = torch.full((block_max.shape[1],), float(SCREEN_BLOCK), dtype=torch.float64)
        sizes[-1] = self.vocab - (block_max.shape[1] - 1) * SCREEN_BLOCK
        capped = torch.minimum(block_max.double(), cut.double()[:, None])
        envelope = sizes * torch.exp((capped + b[:, None] - top[:, None]) / t[:, None])
        total = held + envelope.sum(dim=1)
        ok = (temps > 0) & (counts > 0) & ~broken & torch.isfinite(total) & (held >= self.min_mass * total)
        u = torch.rand(rows, generator=generator, dtype=torch.float64) * total
        in_head = ok & (u < held)
        # A candidate: the inverse CDF over the row's slice of cum.
        pick = torch.searchsorted(cum, base + u, right=True)
        pick = torch.minimum(torch.maximum(pick, first), last)
        for i in torch.nonzero(in_head).flatten().tolist():
            tokens[i] = int(cand_cols[pick[i]])
        # A tail token: its block from the envelope, a uniform token inside, kept with
        # probability exact weight / envelope (else the exact path draws the row).
        for i in torch.nonzero(ok & ~in_head).flatten().tolist():
            blocks = torch.cumsum(envelope[i], 0)
            j = min(int(torch.searchsorted(blocks, (u[i] - held[i]).reshape(1), right=True)), len(blocks) - 1)
            u2, u3 = torch.rand(2, generator=generator, dtype=torch.float64).tolist()
            v = j * SCREEN_BLOCK + min(int(u2 * sizes[j]), int(sizes[j]) - 1)
            if approx[i, v] >= cut[i]:
                continue  # a candidate, which the envelope does not cover
            logit = float(self.weight[v] @ x[i])
            if u3 < math.exp(min(0.0, (logit - float(capped[i, j]) - float(b[i])) / float(t[i]))):
                tokens[i] = v
