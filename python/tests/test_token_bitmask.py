"""Grammar masks in the worker: the packed bits the engine sends (xgrammar's
layout) become -inf on exactly the tokens they do not allow, on the rows
mask_rows names, before sampling and logprobs; a step with mask_rows waits for
its StepMask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from baton_worker.runtime.loading import load_worker
from baton_worker.runtime.options import WorkerOptions
from baton_worker import protocol
from baton_worker.protocol import AddedRequest, ProtocolError, SamplingParams, Step, StepMask
from baton_worker.sampling.token_bitmask import allowed_on_host, apply_token_bitmask, unpack_bitmask, words_per_row
from random_models import make_model_dir


def pack(allowed: np.ndarray) -> np.ndarray:
    """bool [rows, vocab] -> int32 [rows * words], bit j of word w = token 32w + j (the reference packing)."""
    rows, vocab = allowed.shape
    words = words_per_row(vocab)
    out = np.zeros((rows, words), np.uint32)
    for r in range(rows):
        for t in np.flatnonzero(allowed[r]):
            out[r, t // 32] |= np.uint32(1) << np.uint32(t % 32)
    return out.view(np.int32).reshape(-1)


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 100, 1000])
def test_unpack_is_the_inverse_of_packing(vocab):
    rng = np.random.default_rng(vocab)
    allowed = rng.random((3, vocab)) < 0.3
    allowed[:, -1] = True  # the last (partial-word) token, and the sign bit when vocab % 32 == 0
    packed = pack(allowed)
    # The device path (torch shifts) and the host path (numpy unpackbits) agree with the reference.
    assert torch.equal(unpack_bitmask(torch.from_numpy(packed.reshape(3, words_per_row(vocab))), vocab), torch.from_numpy(allowed))
    assert (allowed_on_host(packed, 3, vocab) == allowed).all()


def test_apply_masks_only_the_named_rows_in_place():
    rng = np.random.default_rng(0)
    vocab = 77
    logits = torch.from_numpy(rng.standard_normal((4, vocab)).astype(np.float32))
    before = logits.clone()
    allowed = rng.random((2, vocab)) < 0.5
    apply_token_bitmask(logits, np.array([1, 3]), pack(allowed))
    for row in (0, 2):
        assert torch.equal(logits[row], before[row])
    for r, row in enumerate((1, 3)):
        finite = torch.isfinite(logits[row]).numpy()
        assert (finite == allowed[r]).all()
        assert torch.equal(logits[row][allowed[r]], before[row][allowed[r]])
    # Every row at once (the common case when all requests are constrained); kept logits keep their exact bits.
    full = before.clone()
    every = rng.random((4, vocab)) < 0.5
    apply_token_bitmask(full, np.arange(4), pack(every))
    assert (torch.isfinite(full).numpy() == every).all()
    assert torch.equal(full[torch.from_numpy(every)], before[torch.from_numpy(every)])
    assert bool((full[~torch.from_numpy(every)] == float("-inf")).all())
    # Other dtypes take the masked_fill path.
    half = before.to(torch.bfloat16)
    apply_token_bitmask(half, np.arange(4), pack(every))
    assert (torch.isfinite(half).numpy() == every).all()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir("qwen2", tmp_path_factory.mktemp("m") / "qwen2", variant=0)


def _runner(model_dir):
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=32)
    return load_worker(opts).runner


def _three_prompts_step(mask_rows, sampling):
    added = [AddedRequest(i, np.array([5 + i, 9, 12], np.int32), 3, sampling) for i in range(3)]
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    return Step(4, added, i32(), i32(0, 1, 2), i32(3, 3, 3), i32(0, 0, 0), i32(1, 1, 1), i32(0, 1, 2), np.ones(3, np.uint8), mask_rows=i32(*mask_rows))


def test_step_waits_for_its_mask_and_samples_only_allowed_tokens(model_dir):
    runner = _runner(model_dir)
    vocab = runner.vocab_size
    allowed = np.zeros((2, vocab), bool)
    allowed[0, [17, 300]] = True
    allowed[1, 42] = True
    waited = []

    def wait(step_id):
        waited.append(step_id)
        return StepMask(step_id, pack(allowed))

    sampling = SamplingParams(temperature=1.0, seed=5, logprobs=2)
    result = runner.execute(_three_prompts_step([0, 2], sampling), wait)
    assert waited == [4]
    assert result.token_ids[0] in (17, 300)
    assert result.token_ids[2] == 42
    # Logprobs are of the masked distribution: the forced token is certain, and the
    # top-2 (two per row, row after row) of row 0 are its two allowed tokens, of row 2 one.
    assert result.logprobs[2] == pytest.approx(0.0, abs=1e-6)
    assert sorted(result.top_ids[:2].tolist()) == [17, 300]
    assert np.isfinite(result.top_logprobs[:4]).all()
    assert result.top_ids[4] == 42 and np.isneginf(result.top_logprobs[5])


def test_unmasked_rows_sample_as_without_masks(model_dir):
    sampling = SamplingParams(temperature=1.0, seed=11)
    plain = _runner(model_dir).execute(_three_prompts_step([], sampling))
    allowed = np.ones((1, _runner(model_dir).vocab_size), bool)
    masked = _runner(model_dir).execute(_three_prompts_step([1], sampling), lambda s: StepMask(s, pack(allowed)))
    assert masked.token_ids.tolist() == plain.token_ids.tolist()


@pytest.mark.parametrize(
    "mask_rows,mask_words,error",
    [
        ([3], None, r"^Step\.mask_rows: must be increasing indices among the 3 sampled rows"),
        ([1, 1], None, r"^Step\.mask_rows: must be increasing"),
        ([0], 5, r"^StepMask\.bitmask: has 5 words, 1 masked rows need"),
    ],
)
def test_bad_masks_are_named(model_dir, mask_rows, mask_words, error):
    runner = _runner(model_dir)
    words = words_per_row(runner.vocab_size) * len(mask_rows) if mask_words is None else mask_words
    with pytest.raises(ProtocolError, match=error):
        runner.execute(_three_prompts_step(mask_rows, SamplingParams(temperature=0.0)), lambda s: StepMask(s, np.zeros(words, np.int32)))


def test_worker_waits_for_the_mask_and_keeps_what_comes_meanwhile(tmp_path):
    """Over real sockets, as a worker lane sends them: a row-less step (graph
    work only) before and after a Step with mask_rows, then (overlap) the next
    Step and a Ping before its StepMask. The row-less step never waits, the Ping
    is answered at once, the mask applies to its step, and the rest run after."""
    from test_server import Engine

    model = make_model_dir("llama", tmp_path / "llama", variant=3)
    engine = Engine(tmp_path, ["--model", str(model), "--block-size", "4", "--num-blocks", "32", "--dtype", "float32"])
    try:
        ready = engine.recv()
        i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
        rowless = lambda step_id: Step(step_id, [], i32(), i32(), i32(), i32(), i32(), i32(), np.zeros(0, np.uint8))  # noqa: E731
        added = AddedRequest(1, i32(3, 1, 4, 1, 5), 5, SamplingParams(temperature=0.0))
        engine.send(rowless(0))
        engine.send(Step(1, [added], i32(), i32(1), i32(5), i32(0), i32(2), i32(0, 1), np.ones(1, np.uint8), mask_rows=i32(0)))
        engine.send(Step(2, [], i32(), i32(1), i32(1), i32(5), i32(0), i32(), np.ones(1, np.uint8)))
        engine.send(rowless(3))
        engine.send(protocol.Ping(9))
        assert engine.recv().step_id == 0
        assert engine.recv() == protocol.Pong(9)
        allowed = np.zeros((1, ready.vocab_size), bool)
        allowed[0, 77] = True
        engine.send(StepMask(1, pack(allowed)))
        first = engine.recv()
        assert first.step_id == 1 and first.token_ids.tolist() == [77]
        assert engine.recv().step_id == 2
        assert engine.recv().step_id == 3
        engine.send(protocol.Shutdown())
        assert engine.wait()[0] == 0
    finally:
        engine.close()
