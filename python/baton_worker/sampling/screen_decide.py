"""The head screen's per-row decisions, compiled with numba (head_screen.py says
what they are and why they are exact).

After the screen's GEMM and block maxima (torch: both run on every core), what
is left is a few hundred tokens per row: the candidates' float32 rescoring,
the first maximum, and for a sampled row the proposal's masses and a few
draws. As torch operators that was over 700 small calls per step (about 3 ms
of dispatch for 32 rows); here it is one call, row by row, touching only the
blocks near each row's top.

numba compiles `decide_rows` on first use and caches the machine code next to
this file (__pycache__); HeadScreen warms it at load time, so no request waits
for the compiler. Without numba there is no screen (the exact path decides
every row).
"""

from __future__ import annotations

import math

import numpy as np

try:
    import numba
except ImportError:  # the screen is then off: head_screen.native_screen_kind answers None
    numba = None

# Reassociation (and FMA) only, so the rescoring's dot products vectorize;
# NaN and inf keep their IEEE meaning (a bound of inf sends a row away).
_FAST = {"reassoc", "contract", "nsz"}
# Rows with b > this * T go to the exact path: every token outside the
# candidates is proposed up to e^(2b/T) times too often, so such a row would be
# refused nearly always.
MAX_BOUND_OVER_T = 30.0
# Envelopes that need only dominate exp(y), y <= 0, come from a table of
# 2^(-m / 8), rounded up (a lookup instead of an exp; at most 9% over):
# m = floor(-8 y log2(e)), m = 0 .. past float64's underflow.
ENVELOPE_STEPS = 8
_ENVELOPE = np.nextafter(np.exp2(-np.arange(8 * 1080, dtype=np.float64) / ENVELOPE_STEPS), np.inf)
_ENVELOPE[-1] = 0.0  # below 2^-1075: exp is 0 in float64 too
_SCALE = ENVELOPE_STEPS / math.log(2.0)


def _upper_exp(y, table):
    """At least exp(y) for y <= 0, within 2^(1/8) of it."""
    z = -y * _SCALE * (1.0 - 1e-12)  # never rounds to a larger m
    if z < 1.0:
        return table[0]
    if z >= table.shape[0]:
        return table[table.shape[0] - 1]
    return table[int(z)]


def _dot(w, x):
    """float32 w . x, float32 sums in any order (the bound allows for it)."""
    s = np.float32(0.0)
    for h in range(x.shape[0]):
        s += w[h] * x[h]
    return s


def _candidates(a, bm, cut, block, cand):
    """The tokens with approx >= cut, in token order, into cand (as many as fit);
    returns how many there are. Only the blocks whose maximum reaches cut are read."""
    n = 0
    for j in range(bm.shape[0]):
        if bm[j] >= cut:
            for v in range(j * block, (j + 1) * block):
                if a[v] >= cut:
                    if n < cand.shape[0]:
                        cand[n] = v
                    n += 1
    return n


def _near_block(a, start, stop, near_cut, cand, exact, c, n, top, b, inv_t, table):
    """A near block's tokens [start, stop): (the summed weights of its candidates
    and of its tokens at or above near_cut, how many are below, the largest of
    those, the index of the next candidate after the block)."""
    s = 0.0
    low = np.float32(-np.inf)
    n_low = 0
    cut32 = np.float32(near_cut)
    for v in range(start, stop):
        av = a[v]
        if av >= cut32:  # few: the candidates and the tokens just below them
            if c < n and cand[c] == v:
                s += math.exp((exact[c] - top - b) * inv_t)
                c += 1
            else:
                s += upper_exp((av - top) * inv_t, table)
        else:
            n_low += 1
            low = max(low, av)
    return s, n_low, low, c


def _in_near_block(a, start, stop, near_cut, cand, exact, n, top, b, inv_t, table, low_weight, target):
    """The token of a near block at which its running weight passes target (the last
    with any weight, should the sums round apart), and its proposal weight; the
    weights are _near_block's."""
    c = np.searchsorted(cand[:n], start)
    cut32 = np.float32(near_cut)
    run = 0.0
    token = -1
    proposed = 0.0
    for v in range(start, stop):
        av = a[v]
        if av >= cut32:
            if c < n and cand[c] == v:
                q = math.exp((exact[c] - top - b) * inv_t)
                c += 1
            else:
                q = upper_exp((av - top) * inv_t, table)
        elif av > -np.inf:
            q = low_weight
        else:
            q = 0.0  # padding
        if q > 0.0:
            token = v
            proposed = q
            run += q
            if run > target:
                break
    return token, proposed


def _decide_row(a, bm, xr, vocab, b, t, margin, reach, weight, u, table, cand, exact, mass, envelope):
    """One row's token, or -1: the arguments are _decide_rows', for row r."""
    if not (b < 1e30):  # inf or NaN: the exact path
        return -1
    per_row = bm.shape[0]
    block = a.shape[0] // per_row
    top = np.float64(bm[0])
    check = 0.0  # stays finite unless a block's maximum is NaN or inf
    for j in range(per_row):
        top = max(top, np.float64(bm[j]))
        check += bm[j]
    if not (abs(check) < np.inf):
        return -1
    cut = top - 2.0 * b - t * margin
    n = _candidates(a, bm, cut, block, cand)
    if n > cand.shape[0]:  # the bound is too loose for this row's logits
        return -1
    best = np.float32(-np.inf)
    best_token = -1
    for c in range(n):
        exact[c] = _dot(weight[cand[c]], xr)
        if exact[c] > best:  # the first maximum wins, as torch.argmax's
            best = exact[c]
            best_token = cand[c]
    if t == 0.0:
        return best_token
    if not (b < MAX_BOUND_OVER_T * t):
        return -1

    # The proposal, scaled by e^(-top / T): a candidate weighs its float32 weight
    # exp((logit - top - b) / T); a token within `reach` T below the cut its own
    # envelope exp((approx - top) / T); every other token of a block the envelope
    # of the block's largest such token (a far block: of its maximum).
    inv_t = 1.0 / t
    near_cut = cut - reach * t
    last = per_row - 1
    padding = a.shape[0] - vocab  # -inf tokens at the end of the last block, which is always near
    total = 0.0
    c = 0
    for j in range(per_row):
        if bm[j] < near_cut and not (padding > 0 and j == last):
            envelope[j] = upper_exp((bm[j] - top) * inv_t, table)
            mass[j] = block * envelope[j]
        else:
            s, n_low, low, c = _near_block(a, j * block, (j + 1) * block, near_cut, cand, exact, c, n, top, b, inv_t, table)
            if j == last:
                n_low -= padding
            envelope[j] = upper_exp((low - top) * inv_t, table) if n_low > 0 else 0.0
            mass[j] = s + n_low * envelope[j]
        total += mass[j]

    for k in range(u.shape[0]):
        # A block by its mass (the last one with any, should the sums round apart), then a token in it.
        target = u[k, 0] * total
        j = -1
        run = 0.0
        for i in range(per_row):
            if mass[i] > 0.0:
                j = i
                run += mass[i]
                if run > target:
                    break
        if j < 0:
            return -1
        if bm[j] < near_cut and not (padding > 0 and j == last):
            token = j * block + min(int(u[k, 1] * block), block - 1)  # a far block: all alike
            proposed = envelope[j]
        else:
            token, proposed = _in_near_block(a, j * block, (j + 1) * block, near_cut, cand, exact, n, top, b, inv_t, table,
                                             envelope[j], u[k, 1] * mass[j])
        # Kept with probability (float32 weight) / (proposal weight): 1 for a candidate.
        c = np.searchsorted(cand[:n], token)
        logit = exact[c] if c < n and cand[c] == token else _dot(weight[token], xr)
        if u[k, 2] * proposed < math.exp((logit - top - b) * inv_t):
            return token
    return -1


def _decide_rows(approx, block_max, vocab, bound, temps, margin, reach, max_candidates, weight, x, uniforms, tokens, table):
    """approx: float32 [rows, padded] (-inf past vocab); block_max: float32 [rows,
    blocks]; bound, temps: float64 [rows] (temperature 0: greedy); weight: the
    float32 head [vocab, hidden]; x: float32 [rows, hidden]; uniforms: float64
    [rows, draw rounds, 3]; table: _ENVELOPE. Writes each row's token, or -1
    (the exact path decides), into tokens (int64 [rows])."""
    rows, per_row = block_max.shape
    cand = np.empty((rows, max_candidates), np.int64)
    exact = np.empty((rows, max_candidates), np.float32)
    mass = np.empty((rows, per_row), np.float64)
    envelope = np.empty((rows, per_row), np.float64)
    for r in range(rows):
        tokens[r] = _decide_row(approx[r], block_max[r], x[r], vocab, bound[r], temps[r], margin, reach, weight, uniforms[r],
                                table, cand[r], exact[r], mass[r], envelope[r])


if numba is not None:
    _jit = dict(cache=True, nogil=True, fastmath=_FAST)
    upper_exp = numba.njit(inline="always", **_jit)(_upper_exp)
    _dot, _candidates, _near_block, _in_near_block, _decide_row = (
        numba.njit(**_jit)(f) for f in (_dot, _candidates, _near_block, _in_near_block, _decide_row))
    _compiled = numba.njit(**_jit)(_decide_rows)
else:
    _compiled = None


def decide_rows(approx: np.ndarray, block_max: np.ndarray, vocab: int, bound: np.ndarray, temps: np.ndarray, margin: float,
                reach: float, max_candidates: int, weight: np.ndarray, x: np.ndarray, uniforms: np.ndarray, tokens: np.ndarray) -> None:
    """_decide_rows, compiled (the first call of a process loads or builds it)."""
    _compiled(approx, block_max, vocab, bound, temps, margin, reach, max_candidates, weight, x, uniforms, tokens, _ENVELOPE)
