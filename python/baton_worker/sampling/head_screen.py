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

Sampling at temperature T is exact rejection sampling. Weights are scaled
by e^(-top / T) (top: the row's largest approximate logit). The candidates
(approximate logit within 2b + T * NEAR_MARGIN of the top) are proposed with
their float32 weight exp((logit - top - b) / T) itself. Every other token gets
an envelope of at least exp((approx - top) / T), which is at least its
float32 weight: its own for the tokens within BLOCK_REACH T below the
candidates, else its block's largest (one per block of SCREEN_BLOCK tokens,
from the block maxima, so most of the vocabulary costs one lookup per block).
A token drawn from the proposal (a block by its mass, then a token in it) is
kept with probability (its float32 weight) / (its proposal weight): always
for a candidate. A refused row draws again, DRAW_ROUNDS times at most, then
is left to the exact path, which draws it afresh: rejection sampling's
accepted token does not depend on the round it was accepted in, so the
fallback keeps the distribution exact.

The GEMM and the block maxima are torch's (on every core); the decisions row
by row are screen_decide.py's, compiled with numba: there is no screen
without numba.

Seeded rows, edited logits (penalties, biases, min_tokens, grammars), top-k,
top-p, min-p and logprobs all need the whole float32 row: those rows take the
exact path (step_runner.py splits the step).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..runtime.request_state import RequestState
from .sampler import edits_logits, is_greedy

# Rows screened at once: their [rows, vocab] float32 logits stay under glibc's
# 32 MB mmap ceiling (a larger buffer is mapped and faulted in afresh at every
# step: 49 ms instead of 30 for 256 rows of the 19.7M Llama's int8 head), and
# oneDNN's GEMM is as fast per row at 32 as at 256.
SCREEN_ROWS = 32
# The numbers of a step's screened rows at which its caller shares them out,
# one share per core (cpu_threads.py), each screened by a plain thread with
# one OpenMP thread (the GEMM, block maxima and decisions of a share hold no
# GIL). On the 19.7M Llama (2 cores, 32 rows, served with its clients on the
# same cores): 2545-2609 output tok/s at T=1 shared, against 1971-2318 on 2
# OpenMP threads. Fewer rows are screened on every core: oneDNN's GEMM splits
# the vocabulary instead, since a few rows read the whole head, and one thread
# alone reads it at half the speed (1 row: 1.0 ms on 2 threads, about 2.3 on
# 1). So are more: each share reads the whole head once per SCREEN_ROWS rows,
# and alone on the machine the sampling of 256 shared rows took 67-80 ms
# against 35-58 (served at 256 requests, the two were even).
SPLIT_ROWS = range(16, 65)
# Tokens per block of the screen's block maxima (a [rows, vocab / 64] table is
# cheap to scan for the blocks that hold candidates).
SCREEN_BLOCK = 64
# How far below the top (in units of temperature, beyond 2b) a sampled row's
# candidates reach. Each one costs a float32 rescoring; each token left out
# is proposed up to e^(2b/T) times too often and then mostly refused.
NEAR_MARGIN = 4.0
# A sampled row's proposal gives its own envelope to each token within this
# many T below its candidates, and the rest of a block its largest. The
# blocks that hold such tokens are read token by token (most of the cost);
# with less reach, more draws are refused. On the 19.7M Llama (int8, 32 rows):
# reach 4 / 2 / 0 took 2.6 / 1.9 / 1.5 ms at T=1, all rows decided; 4.7 / 3.3
# / 2.7 ms at T=1.5, with 1 / 4 / 31 of 1024 rows left to the exact path.
BLOCK_REACH = 2.0
# A row with more candidates than this goes to the exact path (on the 19.7M
# Llama, int8 / bfloat16: at most 57 / 15 at temperature 0, 189 / 57 at 1,
# 326 / 105 at 1.5).
MAX_CANDIDATES_PER_ROW = 512
# Proposals per sampled row before the exact path draws it instead (a round
# costs microseconds; the exact path's head, a millisecond).
DRAW_ROUNDS = 8
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
    from . import screen_decide

    if screen_decide.numba is None:
        return None
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


# Relative slack on norms and sums computed in float64 (their own rounding is ~1e-15).
_F64_SLACK = 1 + 1e-9


def _rounded_head_norms(w: torch.Tensor, rounded: torch.Tensor, vocab: int) -> tuple[float, float]:
    """max_v |w^_v|_2 and max_v |w^_v - w_v|_2 over the vocabulary, in float64:
    the two factors of a rounded head's side of the bound."""
    w, rounded = w[:vocab].double(), rounded[:vocab].double()
    return rounded.norm(dim=1).max().item() * _F64_SLACK, (rounded - w).norm(dim=1).max().item() * _F64_SLACK


# Both kinds round x and the head before multiplying: with x^ = x + dx and
# w^_v = w_v + dw_v, x^ . w^_v - x . w_v = dx . w^_v + x . dw_v, so by
# Cauchy-Schwarz |x^ . w^_v - x . w_v| <= |dx|_2 max |w^_v|_2 + |x|_2 max |dw_v|_2.
# dx is known exactly at each step and dw at load time, so this is about 0.6x
# the worst case of the roundings' half steps (on the 19.7M Llama's int8 head:
# b of 3.0 instead of 4.1, and a third less time deciding at T=1).


class _Bf16Projection:
    """Both factors rounded to bfloat16 (u = 2^-8), products summed in float32, the
    sum rounded to bfloat16: |approx - logit| <= |dx|_2 max |w^_v|_2 + |x|_2 max |dw_v|_2
    + (u + 2 g_H) (1 + u)^3 |x|_2 max |w_v|_2 + the reference's 3 g_H |x|_2 max |w_v|_2."""

    def __init__(self, padded_weight: torch.Tensor, vocab: int, rows_hint: int):
        rounded = padded_weight.to(torch.bfloat16)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(rounded, rows_hint)
        self.rounded_norm, self.rounding_norm = _rounded_head_norms(padded_weight, rounded.float(), vocab)
        hidden = padded_weight.shape[1]
        g_h = hidden * 2.0**-24 / (1 - hidden * 2.0**-24)
        w_norm = padded_weight[:vocab].double().norm(dim=1).max().item() * _F64_SLACK
        self.sum_slack = ((_UNIT_ROUNDOFF + 2 * g_h) * (1 + _UNIT_ROUNDOFF) ** 3 + _reference_slack(hidden)) * w_norm
        # float32 logits, kept between steps (a fresh one costs more than filling it); one per thread, as shares run at once.
        self._local = threading.local()

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = x.shape[0]
        rounded = x.to(torch.bfloat16)
        product = torch.ops.mkldnn._linear_pointwise(rounded, self.packed, None, "none", [], "")
        scratch = getattr(self._local, "scratch", None)
        if scratch is None or scratch.shape[0] < rows or scratch.shape[1] != product.shape[1]:
            self._local.scratch = None
            scratch = self._local.scratch = torch.empty(max(rows, 32), product.shape[1])
        x64 = x.double()
        x_norm = x64.norm(dim=1) * _F64_SLACK
        dx_norm = (rounded.double() - x64).norm(dim=1) * _F64_SLACK
        bound = dx_norm * self.rounded_norm + x_norm * (self.rounding_norm + self.sum_slack)
        return scratch[:rows].copy_(product), bound


class _Int8Projection:
    """The head rounded to int8 per vocabulary row (scale s_v = max |w_v| / 127),
    the step's rows to uint8 with one scale s_x and zero point; the int32 sums
    are exact and scaled once in float32 (at most 3 roundings, 2^-24 each, of a
    product no larger than |x^|_2 |w^_v|_2). Per row:
    |approx - logit| <= |dx|_2 max |w^_v|_2 + |x|_2 max |dw_v|_2
                        + (8 2^-24 + 3 g_H) (|x|_2 + |dx|_2) max(|w_v|_2, |w^_v|_2)."""

    def __init__(self, padded_weight: torch.Tensor, vocab: int, rows_hint: int):
        w = padded_weight
        hidden = w.shape[1]
        peak = w.abs().amax(dim=1)
        self.scales = torch.where(peak > 0, peak / 127, torch.ones_like(peak))
        q = torch.round(w / self.scales[:, None]).clamp_(-127, 127).to(torch.int8)
        self.packed = torch.ops.onednn.qlinear_prepack(q, [rows_hint, hidden])
        self.zero_points = torch.zeros(w.shape[0], dtype=torch.int64)
        # w^ exactly as oneDNN scales it: float32 s_v times the int8 row.
        self.rounded_norm, self.rounding_norm = _rounded_head_norms(w, q.double() * self.scales.double()[:, None], vocab)
        self.w_norm = max(w[:vocab].double().norm(dim=1).max().item() * _F64_SLACK, self.rounded_norm)
        self.rounding = 8 * 2.0**-24 + _reference_slack(hidden)

    def _quantization(self, x: torch.Tensor) -> tuple[float, int]:
        """The step's scale (a float32 value, as oneDNN takes it) and zero point
        (rows share them; a NaN or inf anywhere makes every row's bound inf)."""
        lo, hi = min(x.min().item(), 0.0), max(x.max().item(), 0.0)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return math.inf, 0
        scale = float(np.float32((hi - lo) / 254)) or 1.0  # 254: round(x / scale) + zero point stays within [0, 255]
        return scale, int(round(-lo / scale))

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale, zero = self._quantization(x)
        finite = not math.isinf(scale)
        q = torch.round(x / (scale if finite else 1.0)).add_(zero).clamp_(0, 255).to(torch.uint8)
        approx = torch.ops.onednn.qlinear_pointwise(q, scale if finite else 1.0, zero, self.packed, self.scales, self.zero_points, None,
                                                    1.0, 0, torch.float32, "none", [], "")
        if not finite:  # the bounds send every row to the exact path
            return approx, torch.full((x.shape[0],), math.inf, dtype=torch.float64)
        x64 = x.double()
        x_norm = x64.norm(dim=1) * _F64_SLACK
        dx_norm = ((q.double() - zero) * scale - x64).norm(dim=1) * _F64_SLACK
        bound = dx_norm * self.rounded_norm + x_norm * self.rounding_norm + self.rounding * (x_norm + dx_norm) * self.w_norm
        return approx, bound


class HeadScreen:
    """weight: the float32 head [vocab, hidden], kept (not copied) for the exact
    rescoring; kind: the screen's arithmetic, "int8" or "bfloat16"."""

    def __init__(self, weight: torch.Tensor, kind: str = "bfloat16", rows_hint: int = 32, margin: float = NEAR_MARGIN,
                 reach: float = BLOCK_REACH, rounds: int = DRAW_ROUNDS):
        self.vocab, hidden = weight.shape
        self.kind = kind
        self.margin, self.reach, self.rounds = margin, reach, rounds
        # The rescoring reads the head itself (a contiguous head is not copied).
        self.weight_rows = weight.detach().contiguous().numpy()
        # Padded to whole blocks with zero rows; their logits become -inf before the screen reads them.
        self.padded = -(-self.vocab // SCREEN_BLOCK) * SCREEN_BLOCK
        padded = torch.zeros(self.padded, hidden, dtype=weight.dtype)
        padded[: self.vocab] = weight
        projection = {"int8": _Int8Projection, "bfloat16": _Bf16Projection}[kind]
        self.projection = projection(padded, self.vocab, rows_hint)
        # One thread per core for the shares of a step (SPLIT_ROWS); the cores are the worker's share, set by now.
        self.threads = torch.get_num_threads()
        self._shares = (ThreadPoolExecutor(self.threads, thread_name_prefix="baton-screen", initializer=torch.set_num_threads, initargs=(1,))
                        if self.threads > 1 else None)
        # numba builds (or loads from its cache) the decisions now, not in a request's step.
        self.sample(torch.zeros(2, hidden), [0.0, 1.0], torch.Generator().manual_seed(0))

    @torch.inference_mode()
    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The screen's logits, float32 [rows, padded] (-inf past the vocabulary),
        and b per row, float64 [rows]: how far an approximate logit can be from
        the float32 one."""
        approx, bound = self.projection.project(x)
        if self.padded > self.vocab:
            approx[:, self.vocab :] = float("-inf")
        return approx, bound

    def approximate(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x)[0]

    def bounds(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(x)[1]

    @torch.inference_mode()
    def sample(self, x: torch.Tensor, temperatures: list[float], generator: torch.Generator, shares: int = 1) -> np.ndarray:
        """x: float32 head input [rows, hidden] (after the final norm); temperatures:
        0 for a greedy row; shares: how many plain threads may screen parts of the
        rows (1: the calling thread alone, on its OpenMP threads; SPLIT_ROWS says
        when a caller should ask for more).
        Returns int64 [rows]: each row's token, or -1 where the exact path must
        decide."""
        rows = x.shape[0]
        # Drawn here, in row order: the generator's stream does not depend on how rows are shared.
        uniforms = torch.rand(rows, self.rounds, 3, dtype=torch.float64, generator=generator).numpy()
        temps = np.asarray(temperatures, dtype=np.float64)
        tokens = np.empty(rows, dtype=np.int64)

        def screen(span: slice) -> None:
            for i in range(span.start, span.stop, SCREEN_ROWS):
                chunk = slice(i, min(i + SCREEN_ROWS, span.stop))
                tokens[chunk] = self._sample_rows(x[chunk], temps[chunk], uniforms[chunk])

        shares = min(shares, self.threads, rows)
        if shares <= 1 or self._shares is None:
            screen(slice(0, rows))
            return tokens
        edges = [rows * i // shares for i in range(shares + 1)]
        for future in [self._shares.submit(screen, slice(edges[i], edges[i + 1])) for i in range(shares)]:
            future.result()
        return tokens

    def _sample_rows(self, x: torch.Tensor, temps: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
        from .screen_decide import decide_rows  # numba's import takes half a second: only workers with a screen pay it

        rows = x.shape[0]
        approx, bound = self.project(x)
        block_max = approx.view(-1, SCREEN_BLOCK).amax(dim=1).view(rows, -1)
        tokens = np.empty(rows, dtype=np.int64)
        decide_rows(approx.numpy(), block_max.numpy(), self.vocab, bound.numpy(), temps, self.margin, self.reach, MAX_CANDIDATES_PER_ROW,
                    self.weight_rows, x.contiguous().numpy(), uniforms, tokens)
        return tokens
