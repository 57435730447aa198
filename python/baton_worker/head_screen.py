"""The vocabulary projection screened in low precision, decided exactly in float32.

On CPU the head ([rows, hidden] x [hidden, vocab]) is most of a small model's
step, and a plain request (greedy, or temperature alone with no seed) needs
only a few of its logits exactly: the ones near the top. So the screen
multiplies in int8 (VNNI: about 4x the float32 rate) or bfloat16 (AVX512-BF16
or AMX: 2x), bounds how far each approximate logit can be from the float32
one, and computes exactly in float32 only the tokens the bound cannot rule
out.

The bound b, one number per row, comes from a rounding analysis of each kind
(_Bf16Projection, _Int8Projection), and includes the float32 reference's and
the rescoring's own accumulation errors. The tokens whose approximate logit is
within 2b of the row's top hold the float32 argmax; they are rescored in
float32 and the first maximum wins, as torch.argmax's does.

Sampling at temperature T is exact rejection sampling. The proposal gives
each token exp((approx + b - top) / T), which is at least its float32 weight
exp((logit - top) / T) (top: the row's largest approximate logit; both
are scaled alike, so the weights come from one softmax), except
the candidates (approximate logit within 2b + T * NEAR_MARGIN of the top),
which get their float32 weight itself. A token drawn from the proposal (one
inverse-CDF pass, as the sampler's) is kept with probability (its float32
weight) / (its proposal weight): always for a candidate. A refused row draws
again, DRAW_ROUNDS times at most, then is left to the exact path, which draws
it afresh: rejection sampling's accepted token does not depend on the round
it was accepted in, so the fallback keeps the distribution exact.

Seeded rows, edited logits (penalties, biases, min_tokens, grammars), top-k,
top-p, min-p and logprobs all need the whole float32 row: those rows take the
exact path (step_runner.py splits the step).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .request_state import RequestState
from .sampler import edits_logits, inverse_cdf, is_greedy

# Rows screened at once: their [rows, vocab] float32 logits stay under glibc's
# 32 MB mmap ceiling (a larger buffer is mapped and faulted in afresh at every
# step: 49 ms instead of 30 for 256 rows of the 19.7M Llama's int8 head), and
# oneDNN's GEMM is as fast per row at 32 as at 256.
SCREEN_ROWS = 32
# Tokens per block of the screen's block maxima (a [rows, vocab / 64] table is
# cheap to scan for the blocks that hold candidates).
SCREEN_BLOCK = 64
# How far below the top (in units of temperature, beyond 2b) a sampled row's
# candidates reach. Each one costs a float32 rescoring; each token left out
# is proposed up to e^(2b/T) times too often and then mostly refused.
NEAR_MARGIN = 4.0
# A row with more candidates than this goes to the exact path (on the 19.7M
# Llama, int8 / bfloat16: at most 57 / 15 at temperature 0, 189 / 57 at 1,
# 326 / 105 at 1.5).
MAX_CANDIDATES_PER_ROW = 512
# Proposals per sampled row before the exact path draws it instead.
DRAW_ROUNDS = 4
# Rows with b > this * T go to the exact path: a candidate's proposal weight
# carries e^(-b/T), which float32 cannot hold much below e^-87.
MAX_BOUND_OVER_T = 30.0
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


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return set()


def native_screen_kind() -> str | None:
    """The screen's arithmetic this CPU runs in hardware: "int8" (VNNI: about 4x
    the float32 rate), "bfloat16" (AVX512-BF16 or AMX: 2x), or None (oneDNN would
    emulate either, slower than float32)."""
    flags = _cpu_flags()
    if ("avx512_vnni" in flags or "avx_vnni" in flags or "amx_int8" in flags) and int8_products_are_exact():
        return "int8"
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        return "bfloat16"
    return None


def int8_products_are_exact() -> bool:
    """Whether oneDNN's uint8 x int8 GEMM sums without saturating (x86 kernels
    without VNNI pair products in int16 and can clip): extreme and random
    operands against int64 arithmetic."""
    try:
        g = torch.Generator().manual_seed(0)
        q = torch.randint(-127, 128, (40, 64), dtype=torch.int8, generator=g)
        q[0], q[1] = 127, -127
        x = torch.randint(0, 256, (3, 64), dtype=torch.uint8, generator=g)
        x[0] = 255
        packed = torch.ops.onednn.qlinear_prepack(q, [3, 64])
        got = torch.ops.onednn.qlinear_pointwise(x, 1.0, 0, packed, torch.ones(40), torch.zeros(40, dtype=torch.int64), None, 1.0, 0,
                                                 torch.float32, "none", [], "")
    except (RuntimeError, AttributeError):  # a torch without these ops
        return False
    return bool(torch.equal(got.double(), (x.long() @ q.long().t()).double()))


def _reference_slack(hidden: int) -> float:
    """The float32 side of the bound: the reference GEMM's and the rescoring's own
    accumulation errors, 3 g_H (with margin), per unit of |x|_2 |w_v|_2."""
    return 3 * hidden * 2.0**-24 / (1 - hidden * 2.0**-24)


class _Bf16Projection:
    """Both factors rounded to bfloat16 (u = 2^-8), products summed in float32, the
    sum rounded to bfloat16: |approx - logit| <= (3u + 4u^2 + 3 g_H) |x|_2 max |w_v|_2."""

    def __init__(self, padded_weight: torch.Tensor, vocab: int, rows_hint: int):
        self.packed = torch.ops.mkldnn._reorder_linear_weight(padded_weight.to(torch.bfloat16), rows_hint)
        w_norm = padded_weight[:vocab].norm(dim=1).max().item()
        # 1.001: the row norms themselves are float32 sums.
        self.slack = (3 * _UNIT_ROUNDOFF + 4 * _UNIT_ROUNDOFF**2 + _reference_slack(padded_weight.shape[1])) * w_norm * 1.001
        self._scratch: torch.Tensor | None = None  # float32 logits, kept between steps (a fresh one costs more than filling it)

    def bounds(self, x: torch.Tensor) -> torch.Tensor:
        return x.norm(dim=1) * self.slack

    def multiply(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        product = torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.packed, None, "none", [], "")
        if self._scratch is None or self._scratch.shape[0] < rows or self._scratch.shape[1] != product.shape[1]:
            self._scratch = None
            self._scratch = torch.empty(max(rows, 32), product.shape[1])
        return self._scratch[:rows].copy_(product)


class _Int8Projection:
    """The head rounded to int8 per vocabulary row (scale s_v = max |w_v| / 127),
    the step's rows to uint8 with one scale s_x and zero point; the int32 sums
    are exact and scaled once in float32. Per row:
    |approx - logit| <= s_x / 2 max_v |w^_v|_1 + max_v s_v / 2 |x|_1
                        + (8 2^-24 + 3 g_H) (|x|_2 + sqrt(H) s_x) (max |w_v|_2 + sqrt(H) max s_v)."""

    def __init__(self, padded_weight: torch.Tensor, vocab: int, rows_hint: int):
        w = padded_weight
        hidden = w.shape[1]
        peak = w.abs().amax(dim=1)
        self.scales = torch.where(peak > 0, peak / 127, torch.ones_like(peak))
        q = torch.round(w / self.scales[:, None]).clamp_(-127, 127).to(torch.int8)
        self.packed = torch.ops.onednn.qlinear_prepack(q, [rows_hint, hidden])
        self.zero_points = torch.zeros(w.shape[0], dtype=torch.int64)
        # The float32 divisions before rounding w and x move a quotient of at most 255
        # by 255 * 2^-24 < 2^-15: each rounding error is at most half a step times eps.
        eps = 1 + 2.0**-12
        self.s_max = self.scales[:vocab].max().item() * eps
        self.q_l1 = (q[:vocab].abs().sum(dim=1).double() * self.scales[:vocab].double()).max().item() * eps
        self.w_norm = w[:vocab].norm(dim=1).max().item() * 1.001 + hidden**0.5 * self.s_max
        self.rounding = 8 * 2.0**-24 + _reference_slack(hidden)
        self.root_h = hidden**0.5
        self.eps = eps

    def _quantization(self, x: torch.Tensor) -> tuple[float, int]:
        """The step's scale and zero point (rows share them; a NaN or inf anywhere
        makes every row's bound inf, below)."""
        lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return math.inf, 0
        scale = (hi - lo) / 254 or 1.0  # 254: round(x / scale) + zero point stays within [0, 255]
        return scale, int(round(-lo / scale))

    def bounds(self, x: torch.Tensor) -> torch.Tensor:
        scale, _ = self._quantization(x)
        if math.isinf(scale):
            return torch.full((x.shape[0],), math.inf)
        l1 = x.abs().sum(dim=1) * 1.001
        l2 = x.norm(dim=1) * 1.001 + self.root_h * scale
        return scale / 2 * self.eps * self.q_l1 + self.s_max / 2 * l1 + self.rounding * l2 * self.w_norm

    def multiply(self, x: torch.Tensor) -> torch.Tensor:
        scale, zero = self._quantization(x)
        if math.isinf(scale):
            scale = 1.0  # the bounds send every row to the exact path
        q = torch.round(x / scale).add_(zero).clamp_(0, 255).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise(q, scale, zero, self.packed, self.scales, self.zero_points, None, 1.0, 0,
                                                  torch.float32, "none", [], "")


class HeadScreen:
    """weight: the float32 head [vocab, hidden], kept (not copied) for the exact
    rescoring; kind: the screen's arithmetic, "int8" or "bfloat16"."""

    def __init__(self, weight: torch.Tensor, kind: str = "bfloat16", rows_hint: int = 32, margin: float = NEAR_MARGIN,
                 rounds: int = DRAW_ROUNDS):
        self.vocab, hidden = weight.shape
        self.kind = kind
        self.margin, self.rounds = margin, rounds
        self.weight = weight
        # Padded to whole blocks with zero rows; their logits become -inf before the screen reads them.
        self.padded = -(-self.vocab // SCREEN_BLOCK) * SCREEN_BLOCK
        padded = torch.zeros(self.padded, hidden, dtype=weight.dtype)
        padded[: self.vocab] = weight
        projection = {"int8": _Int8Projection, "bfloat16": _Bf16Projection}[kind]
        self.projection = projection(padded, self.vocab, rows_hint)

    def bounds(self, x: torch.Tensor) -> torch.Tensor:
        """b per row: how far an approximate logit can be from the float32 one."""
        return self.projection.bounds(x)

    @torch.inference_mode()
    def approximate(self, x: torch.Tensor) -> torch.Tensor:
        """float32 [rows, padded]: the screen's logits, -inf past the vocabulary."""
        out = self.projection.multiply(x)
        if self.padded > self.vocab:
            out[:, self.vocab :] = float("-inf")
        return out

    @torch.inference_mode()
    def sample(self, x: torch.Tensor, temperatures: list[float], generator: torch.Generator) -> np.ndarray:
        """x: float32 head input [rows, hidden] (after the final norm); temperatures:
        0 for a greedy row. Returns int64 [rows]: each row's token, or -1 where the
        exact path must decide."""
        if x.shape[0] <= SCREEN_ROWS:
            return self._sample_rows(x, temperatures, generator)
        return np.concatenate([self._sample_rows(x[i : i + SCREEN_ROWS], temperatures[i : i + SCREEN_ROWS], generator)
                               for i in range(0, x.shape[0], SCREEN_ROWS)])

    def _sample_rows(self, x: torch.Tensor, temperatures: list[float], generator: torch.Generator) -> np.ndarray:
        rows, vocab = x.shape[0], self.vocab
        approx = self.approximate(x)
        blocks = approx.view(-1, SCREEN_BLOCK)  # row r's block j is blocks[r * per_row + j]
        per_row = self.padded // SCREEN_BLOCK
        block_max = blocks.amax(dim=1).view(rows, per_row)
        top = block_max.amax(dim=1)
        bound = self.bounds(x)
        temps = torch.tensor(temperatures, dtype=torch.float32)
        cut = top - 2 * bound - temps * self.margin  # candidates: approx >= cut

        # Candidates: the tokens >= cut inside the blocks whose maximum reaches it. A row
        # with too many (a bound too loose for its logits' spread) is left to the exact
        # path, so the rescoring never grows toward [rows, vocab].
        reach = block_max >= cut[:, None]
        # (each hit block holds at least one; a row whose cut is not finite, NaN or inf
        # somewhere, gets none either)
        crowded = (reach.sum(dim=1) > MAX_CANDIDATES_PER_ROW) | ~torch.isfinite(cut)
        reach[crowded] = False
        hit = reach.nonzero()
        hit_rows = hit[:, 0]
        inside = blocks.index_select(0, hit_rows * per_row + hit[:, 1]) >= cut[hit_rows][:, None]
        counts = torch.zeros(rows, dtype=torch.int64).index_add_(0, hit_rows, inside.sum(dim=1))
        crowded |= counts > MAX_CANDIDATES_PER_ROW
        if bool(crowded.any()):
            inside &= ~crowded[hit_rows][:, None]  # no candidates: a greedy row stays -1
            bound = bound.masked_fill(crowded, float("inf"))  # and a sampled one draws nothing
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
            self._draw(tokens, approx, block_max, top, bound, temps, cand_rows, cand_cols, exact, x, generator)
        return tokens

    @staticmethod
    def _top_tokens(approx: torch.Tensor, block_max: torch.Tensor) -> torch.Tensor:
        """Each row's first largest approximate logit, from its block maxima."""
        rows, per_row = block_max.shape
        block = block_max.argmax(dim=1)
        inside = approx.view(-1, SCREEN_BLOCK).index_select(0, torch.arange(rows) * per_row + block).argmax(dim=1)
        return block * SCREEN_BLOCK + inside

    def _draw(self, tokens: np.ndarray, approx: torch.Tensor, block_max: torch.Tensor, top: torch.Tensor, bound: torch.Tensor, temps: torch.Tensor,
              cand_rows: torch.Tensor, cand_cols: torch.Tensor, exact: torch.Tensor, x: torch.Tensor, generator: torch.Generator) -> None:
        """Rejection sampling for the rows with temperature > 0 (module docstring).
        approx is used up: its rows become the proposal's weights."""
        rows = approx.shape[0]
        hot = torch.nonzero(temps > 0).flatten()
        t = temps[hot]
        # The proposal, scaled by 1 / S (S: the row's sum of exp((approx - top) / T)):
        # softmax(approx / T) for every token (its fused exp is twice as fast as exp_),
        # then the candidates' float32 weights in their places, divided by e^(b/T) as
        # the softmax leaves the other tokens' b out.
        proposal = approx if len(hot) == rows else approx.index_select(0, hot)
        top_token = self._top_tokens(proposal, block_max if len(hot) == rows else block_max.index_select(0, hot))
        if not bool((t == 1.0).all()):
            proposal.div_(t[:, None])
        torch.softmax(proposal, dim=-1, out=proposal)
        at_top = proposal.gather(1, top_token[:, None])[:, 0]  # 1 / S: the top token's exp(0) / S
        place = torch.full((rows,), -1, dtype=torch.int64)
        place[hot] = torch.arange(len(hot))
        mine = place[cand_rows] >= 0
        r, c = cand_rows[mine], cand_cols[mine]
        weight = torch.exp((exact[mine] - top[r] - bound[r]) / temps[r]) * at_top[place[r]]
        proposal.view(-1).index_copy_(0, place[r] * self.padded + c, weight)
        # The exact path takes a row whose approximate logits are not all finite (a NaN
        # or inf top), and one whose b / T is so large that e^(-b/T) could underflow.
        active = torch.nonzero(torch.isfinite(top[hot]) & (bound[hot] < MAX_BOUND_OVER_T * t)).flatten()
        for _ in range(self.rounds):
            if len(active) == 0:
                break
            weights = proposal if len(active) == len(hot) else proposal.index_select(0, active)
            drawn = inverse_cdf(weights, torch.rand(len(active), 1, generator=generator))
            row = hot[active]
            logit = (self.weight.index_select(0, drawn) * x.index_select(0, row)).sum(dim=1)
            # Kept with probability (float32 weight) / (proposal weight): 1 for a candidate.
            target = torch.exp((logit - top[row] - bound[row]) / temps[row]) * at_top[active]
            kept = torch.rand(len(active), generator=generator) * weights.gather(1, drawn[:, None])[:, 0] < target
            tokens[row[kept].numpy()] = drawn[kept].numpy()
            active = active[~kept]
