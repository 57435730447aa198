"""The head's bfloat16 screen (head_screen.py) against the float32 head it stands in for:
greedy tokens equal torch.argmax of the float32 logits, near-ties included, and
sampled tokens follow the float32 softmax (the screen and its fallback to the
exact path together)."""

import math

import numpy as np
import pytest
import torch

from baton_worker.sampling.head_screen import DRAW_ROUNDS, NEAR_MARGIN, SCREEN_BLOCK, HeadScreen, int8_products_are_exact

if not torch.backends.mkldnn.is_available():
    pytest.skip("the screen multiplies with oneDNN", allow_module_level=True)

# bfloat16 runs everywhere oneDNN does (emulated without AVX512-BF16); int8 only
# where its products are exact (oneDNN's kernels without VNNI can saturate).
KINDS = ["bfloat16"] + (["int8"] if int8_products_are_exact() else [])


def _head(vocab: int, hidden: int, seed: int, scale: float = 0.05) -> torch.Tensor:
    return torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_equal_float32_argmax_with_near_ties_and_duplicates(kind):
    vocab, hidden = 5003, 64  # not a whole number of blocks
    weight = _head(vocab, hidden, 0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(96, hidden, generator=g) * 3
    # Make every row's top token nearly tied with a twin: a copy of its weight moved by
    # about one bfloat16 step of the logit (so the screen often orders the two wrongly),
    # placed before or after it.
    top = (x @ weight.t()).argmax(dim=1)
    for r in range(0, 96, 2):
        twin = (int(top[r]) + 1 + 37 * r) % vocab
        weight[twin] = weight[top[r]] + torch.randn(hidden, generator=g) * 3e-4
    # Exact duplicates: the first index must win, as torch.argmax's does.
    weight[10] = weight[4000]
    x[95] = weight[4000] * 50
    screen = HeadScreen(weight, kind)
    exact = (x @ weight.t()).argmax(dim=1)
    got = screen.sample(x, [0.0] * len(x), torch.Generator().manual_seed(0))
    assert (got >= 0).all()
    assert got.tolist() == exact.tolist()
    assert got[95] == 10
    # Rows shared out between threads (each share quantized on its own) decide the same tokens.
    assert screen.sample(x, [0.0] * len(x), torch.Generator().manual_seed(0), shares=2).tolist() == exact.tolist()
    # The twins really are closer than the screen resolves: its own argmax misses some.
    assert (screen.approximate(x)[:, :vocab].argmax(dim=1) != exact).any()


@pytest.mark.parametrize("kind", KINDS)
def test_every_approximate_logit_is_within_its_rows_bound(kind):
    """The screen is exact only if |approx - float32 logit| <= b for every token:
    rows of very different sizes (int8 rows share one scale), outliers in x and in
    the head, a zero row, heads of several widths."""
    g = torch.Generator().manual_seed(20)
    worst = 0.0
    for hidden in (8, 64, 256):
        weight = _head(SCREEN_BLOCK * 20 + 3, hidden, hidden)
        weight[7] = 0.0
        weight[9, 0] = 3.0  # one large entry: its row's int8 scale is coarse
        weight[100:120] *= 40
        x = torch.randn(12, hidden, generator=g)
        x[1] *= 1e-3  # tiny beside the step's scale
        x[2] *= 50
        x[3, hidden // 2] = 200.0  # an outlier
        x[4] = 0.0
        x[5] = weight[9] * 7
        screen = HeadScreen(weight, kind)
        approx, bound = screen.project(x)
        err = (approx[:, : weight.shape[0]].double() - (x @ weight.t()).double()).abs().amax(dim=1)
        assert (err <= bound).all(), f"hidden {hidden}: errors {err.tolist()} over bounds {bound.tolist()}"
        worst = max(worst, float((err / bound)[bound > 0].max()))
    assert worst > 0.05  # the check compares real errors, not zeros


@pytest.mark.parametrize("kind", KINDS)
def test_the_bound_holds_where_it_is_nearly_tight(kind):
    """In 1 to 4 dimensions a rounding error can nearly line up with the head's
    row, so the bound is close to the largest error: heads and rows of random
    sizes, each token's error within its row's bound."""
    g = torch.Generator().manual_seed(21)
    worst = 0.0
    for trial in range(120):
        hidden = 1 + trial % 4
        weight = torch.randn(SCREEN_BLOCK * 8, hidden, generator=g) * math.exp(float(torch.randn(1, generator=g)) * 2)
        x = torch.randn(8, hidden, generator=g) * torch.exp(torch.randn(8, 1, generator=g) * 2)
        approx, bound = HeadScreen(weight, kind).project(x)
        err = (approx[:, : weight.shape[0]].double() - (x @ weight.t()).double()).abs().amax(dim=1)
        assert (err <= bound).all(), f"trial {trial}: errors {err.tolist()} over bounds {bound.tolist()}"
        worst = max(worst, float((err / bound).max()))
    assert worst > 0.8


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_that_is_not_finite_is_left_to_the_exact_path(kind):
    weight = _head(300, 16, 2)
    x = torch.randn(3, 16)
    x[1, 0] = float("nan")
    x[2, 0] = float("inf")
    got = HeadScreen(weight, kind).sample(x, [0.0, 0.0, 1.0], torch.Generator().manual_seed(0))
    # int8 rows share the step's quantization scale, so one bad row sends them all.
    assert got[0] == (int((x[0] @ weight.t()).argmax()) if kind == "bfloat16" else -1)
    assert got[1] == -1 and got[2] == -1


@pytest.mark.parametrize("kind", KINDS)
def test_a_temperature_too_small_for_the_bound_is_left_to_the_exact_path(kind):
    weight = _head(300, 16, 8)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(9))
    screen = HeadScreen(weight, kind)
    t = float(screen.bounds(x).max()) / 20
    got = screen.sample(x, [t, t / 2, t / 4, 0.0], torch.Generator().manual_seed(0))
    assert got[1] == -1 and got[2] == -1  # b / T of 40 and 80
    assert got[0] >= 0 and got[3] == int((x[3] @ weight.t()).argmax())


@pytest.mark.parametrize("kind", KINDS)
def test_a_bound_too_loose_for_the_logits_leaves_rows_to_the_exact_path(kind):
    """Rows with too many candidates (logits closer together than the
    bound) are not rescored token by token; the exact path takes them."""
    g = torch.Generator().manual_seed(10)
    base = torch.randn(32, generator=g)
    weight = base + torch.randn(SCREEN_BLOCK * 40, 32, generator=g) * 1e-4  # nearly equal rows
    weight[5] = -base  # one far apart: a clear winner for x = -base
    x = torch.stack([-base, base, base])
    got = HeadScreen(weight, kind).sample(x, [0.0, 0.0, 1.0], torch.Generator().manual_seed(0))
    assert got[0] == 5
    assert got[1] == -1 and got[2] == -1


def _chi_square_ok(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """Pearson's statistic with the bins expecting < 5 draws merged, and a bound
    about 5 standard deviations above its mean under the null."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    return stat, dof + 5 * math.sqrt(2 * dof)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "temperature,margin,rounds,spread,shares",
    [
        (1.0, NEAR_MARGIN, DRAW_ROUNDS, 4.0, 1),  # the defaults: candidates hold nearly all the mass
        (1.0, NEAR_MARGIN, DRAW_ROUNDS, 4.0, 2),  # ... with the rows shared out between two threads
        (0.7, 0.0, 1, 3.0, 1),  # no reach beyond 2b: many draws are refused, some rows left to the exact path
        (1.5, 0.0, 0, 1.0, 1),  # no rounds: the exact path draws every row
    ],
)
def test_sampled_tokens_follow_the_float32_softmax(kind, temperature, margin, rounds, spread, shares):
    vocab, hidden, rows, batches = 300, 16, 500, 40
    weight = _head(vocab, hidden, 3, scale=1.0)
    x = torch.randn(1, hidden, generator=torch.Generator().manual_seed(4))
    x = x / x.norm() * spread
    logits = (x.double() @ weight.double().t())[0]
    probs = torch.softmax(logits / temperature, dim=0).numpy()
    screen = HeadScreen(weight, kind, margin=margin, rounds=rounds)
    g = torch.Generator().manual_seed(5)
    fallback_g = torch.Generator().manual_seed(6)
    exact_probs = torch.softmax((x @ weight.t())[0] / temperature, dim=0)
    counts = np.zeros(vocab, np.int64)
    left = 0
    approx = screen.approximate(x)[0, :vocab]
    below = (approx < approx.max() - 2 * screen.bounds(x)[0] - temperature * margin).numpy()  # the tail's tokens
    from_tail = 0
    batch = x.expand(rows, hidden).contiguous()
    for _ in range(batches):
        got = screen.sample(batch, [temperature] * rows, g, shares)
        undecided = got < 0
        left += int(undecided.sum())
        from_tail += int(below[got[~undecided]].sum())
        # The exact path draws the rows the screen leaves, afresh.
        if undecided.any():
            got[undecided] = torch.multinomial(exact_probs, int(undecided.sum()), replacement=True, generator=fallback_g).numpy()
        counts += np.bincount(got, minlength=vocab)
    stat, bound = _chi_square_ok(counts, probs)
    print(f"T={temperature}: {left} of {rows * batches} rows left to the exact path, chi-square {stat:.1f} (bound {bound:.1f})")
    assert stat < bound, f"chi-square {stat:.1f} over {bound:.1f}"
    total = rows * batches
    if rounds == DRAW_ROUNDS:
        assert left < total // 100
    elif rounds == 1:
        assert 0 < left < total and from_tail > 0  # tokens that are not candidates were both kept and refused
    else:
        assert left == total


@pytest.mark.parametrize("kind", KINDS)
def test_tokens_drawn_from_far_blocks_keep_the_softmax(kind):
    """Many blocks, and the candidates' reach cut to nothing: most of the mass
    lies in tokens that are proposed by their block's envelope, so far-block
    draws are both kept and refused, and the tokens still follow the softmax
    (the vocabulary's last block is padded)."""
    vocab, hidden, rows, batches, temperature = SCREEN_BLOCK * 40 + 7, 16, 500, 40, 2.0
    weight = _head(vocab, hidden, 11, scale=1.0)
    x = torch.randn(1, hidden, generator=torch.Generator().manual_seed(12))
    x = x / x.norm() * 3.0
    reach = 0.0
    screen = HeadScreen(weight, kind, margin=0.0, reach=reach, rounds=2)
    exact_probs = torch.softmax((x @ weight.t())[0] / temperature, dim=0)
    probs = torch.softmax((x.double() @ weight.double().t())[0] / temperature, dim=0).numpy()
    approx = screen.approximate(x)[0]
    block_max = approx.view(-1, SCREEN_BLOCK).amax(dim=1)
    cut = float(approx.max() - 2 * screen.bounds(x)[0])
    far = (block_max < cut - reach * temperature).numpy()
    far[-1] = False  # the padded block is always read token by token
    g, fallback_g = torch.Generator().manual_seed(13), torch.Generator().manual_seed(14)
    counts = np.zeros(vocab, np.int64)
    from_far = left = 0
    batch = x.expand(rows, hidden).contiguous()
    for _ in range(batches):
        got = screen.sample(batch, [temperature] * rows, g)
        undecided = got < 0
        left += int(undecided.sum())
        from_far += int(far[got[~undecided] // SCREEN_BLOCK].sum())
        if undecided.any():
            got[undecided] = torch.multinomial(exact_probs, int(undecided.sum()), replacement=True, generator=fallback_g).numpy()
        counts += np.bincount(got, minlength=vocab)
    stat, bound = _chi_square_ok(counts, probs)
    print(f"reach {reach}: {far.sum()} far blocks, {from_far} tokens kept from them, {left} rows refused twice, "
          f"chi-square {stat:.1f} (bound {bound:.1f})")
    assert stat < bound, f"chi-square {stat:.1f} over {bound:.1f}"
    assert far.sum() > 10 and from_far > 1000 and left > 0


@pytest.mark.parametrize("kind", KINDS)
def test_screen_blocks_pad_the_vocabulary(kind):
    weight = _head(SCREEN_BLOCK * 3 + 5, 8, 7)
    screen = HeadScreen(weight, kind)
    approx = screen.approximate(torch.randn(2, 8))
    assert approx.shape == (2, SCREEN_BLOCK * 4)
    assert torch.isinf(approx[:, weight.shape[0] :]).all() and torch.isfinite(approx[:, : weight.shape[0]]).all()
