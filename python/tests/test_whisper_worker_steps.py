"""Whisper loaded as the worker loads it (load_worker on a random directory):
the graph exports the encoder -> decoder graph with the decoder's input role
encoder_states; the StepRunner refuses inconsistent cross-attention fields
naming them; a request's cross K/V, written when it is added, gives
transformers' greedy tokens, with the CPU attention backend and with the
Triton one a CUDA worker runs (in Triton's interpreter here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from baton_worker.models.whisper.build import make_whisper_dir

transformers = pytest.importorskip("transformers")

from baton_worker.protocol import AddedRequest, ProtocolError, SamplingParams, Step  # noqa: E402
from baton_worker.runtime.loading import load_worker  # noqa: E402
from baton_worker.runtime.options import WorkerOptions  # noqa: E402

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "node_modules" / "@lenml" / "tokenizer-gpt2" / "models"
BLOCK = 16
CROSS_BLOCKS = 1500 // BLOCK + 1  # 94


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_whisper_dir(tmp_path_factory.mktemp("whisper_steps"), seed=3, tokenizer_dir=TOKENIZER_DIR)


def load(model_dir, backend: str):
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=BLOCK, num_blocks=400, attention_backend=backend,
                         device="cpu" if backend == "cpu" else "auto")  # the CPU backend runs on the CPU
    return load_worker(opts)


@pytest.fixture(scope="module")
def worker(model_dir):
    return load(model_dir, "cpu")


def i32(*v):
    return np.array(v, np.int32)


def step(step_id, added=(), rows=(), blocks=()):
    """rows: (req_id, num_new, num_computed, new_block_count, sample)."""
    cols = list(zip(*rows)) or [(), (), (), (), ()]
    return Step(step_id, list(added), i32(), i32(*cols[0]), i32(*cols[1]), i32(*cols[2]), i32(*cols[3]), i32(*blocks), np.array(cols[4], np.uint8))


def added(req_id, tokens, states, cross):
    return AddedRequest(req_id, i32(*tokens), len(tokens), SamplingParams(temperature=0.0), encoder_states=states, cross_block_ids=i32(*cross))


PROMPT = [50257, 50258, 50358, 50362]  # <|startoftranscript|><|en|><|transcribe|><|notimestamps|>


def test_the_graph_declares_the_decoder_cross_attending_encoder_states(worker):
    graph = worker.ready.graph
    nodes = {n["name"]: n for n in graph["nodes"]}
    assert nodes["encoder"]["engine"] == "stateless" and nodes["encoder"]["kv_inputs"] == []
    assert nodes["decoder"]["engine"] == "kv_cache" and nodes["decoder"]["kv_inputs"] == ["encoder_states"]
    assert worker.ready.max_model_len == 448 and worker.ready.vocab_size == 51864


def test_cross_attention_fields_are_checked_by_name(worker):
    runner = worker.runner
    store = worker.graph_runner.nodes.store
    good = store.put(torch.randn(1500, 64)).handle
    wrong = store.put(torch.randn(1500, 32)).handle
    cases = [
        (added(1, PROMPT, -1, []), r"Step\.added\[0\]\.encoder_states: this worker's model cross-attends an encoder output; none was given"),
        (added(1, PROMPT, 999_999, range(CROSS_BLOCKS)), r"encoder_states: tensor handle 999999 is not in this worker's store"),
        (added(1, PROMPT, wrong, range(CROSS_BLOCKS)), r"encoder_states: a tensor \[positions, 64\] was expected, got \(1500, 32\)"),
        (added(1, PROMPT, good, range(CROSS_BLOCKS - 1)), r"cross_block_ids: 93 blocks for 1500 positions \(blocks of 16: 94\)"),
        (added(1, PROMPT, good, [*range(CROSS_BLOCKS - 1), 400]), r"cross_block_ids\[93\]: block 400 is outside \[0, 400\)"),
    ]
    for request, error in cases:
        with pytest.raises(ProtocolError, match=error):
            runner.execute(step(0, [request], rows=[(1, 4, 0, 1, 1)], blocks=[300]))
        runner.execute(Step(1, [], i32(1), i32(), i32(), i32(), i32(), i32(), np.zeros(0, np.uint8)))


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_added_cross_kv_gives_transformers_greedy_tokens(model_dir, backend):
    """Also with the Triton self-attention a CUDA worker runs (here in Triton's interpreter)."""
    if backend == "triton":
        pytest.importorskip("triton")
    worker = load(model_dir, backend)
    runner = worker.runner
    store = worker.graph_runner.nodes.store
    model = transformers.WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    features = torch.randn(1, 80, 3000, generator=torch.Generator().manual_seed(5)) * 0.5
    with torch.no_grad():
        states = model.model.encoder(features).last_hidden_state
        expected = model.generate(features, language="en", task="transcribe", do_sample=False, max_new_tokens=12, force_unique_generate_call=True)
    handle = store.put(states[0].clone()).handle
    # Two requests on the same states, cross blocks scattered, one added a step after the other.
    cross_a = list(range(200, 200 + CROSS_BLOCKS))[::-1]
    cross_b = list(range(100, 100 + CROSS_BLOCKS))
    got = {1: [], 2: []}
    out = runner.execute(step(10, [added(1, PROMPT, handle, cross_a)], rows=[(1, 4, 0, 1, 1)], blocks=[0]))
    got[1] += out.token_ids.tolist()
    out = runner.execute(step(11, [added(2, PROMPT, handle, cross_b)], rows=[(1, 1, 4, 0, 1), (2, 4, 0, 1, 1)], blocks=[1]))
    got[1].append(out.token_ids[0].item())
    got[2].append(out.token_ids[1].item())
    for k in range(10):
        n1, n2 = 4 + len(got[1]) - 1, 4 + len(got[2]) - 1
        blocks = [b for b, n in ((2, n1), (3, n2)) if n % BLOCK == 0]
        rows = [(1, 1, n1, int(n1 % BLOCK == 0), 1), (2, 1, n2, int(n2 % BLOCK == 0), 1)]
        out = runner.execute(step(12 + k, rows=rows, blocks=blocks))
        got[1].append(out.token_ids[0].item())
        got[2].append(out.token_ids[1].item())
    assert expected[0].tolist()[: len(PROMPT)] == PROMPT
    want = expected[0].tolist()[len(PROMPT) :][:12]
    assert got[1][:12] == want
    assert got[2][:11] == want[:11]
