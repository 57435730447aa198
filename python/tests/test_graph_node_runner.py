"""NodeRunner: stateless passes batched into one forward, outputs kept in the
worker's TensorStore, client bytes through postprocess, stops, and failure
isolation (a per-request stage fails one pass, forward fails the batch)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from baton_worker.graph import (
    EMIT_TO_CLIENT,
    EngineType,
    GraphEdge,
    GraphModel,
    GraphNode,
    Loop,
    Sequential,
)
from baton_worker.graph.node_runner import (
    ChunkInfo,
    NodePass,
    NodeRunner,
    NodeSubmodule,
    TensorDescriptor,
    TensorStore,
    TokenIds,
)

HIDDEN = 8
UPSAMPLE = 4
SAMPLE_RATE = 24_000


class Embed(NodeSubmodule):
    """Code ids -> hidden frames; batches ragged requests by padding."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Embedding(32, HIDDEN)
        self.calls: list[int] = []  # batch size of each forward

    def prepare_inputs(self, graph_walk, info, inputs):
        if info.request_kwargs.get("fail_prepare"):
            raise ValueError("bad voice")
        return torch.cat(inputs["codes"])

    def preprocess(self, graph_walk, infos, prepared):
        lengths = [len(codes) for codes in prepared]
        padded = torch.nn.utils.rnn.pad_sequence(prepared, batch_first=True)
        return padded, lengths

    def forward(self, graph_walk, infos, batch):
        padded, lengths = batch
        self.calls.append(len(infos))
        if any(info.step_metadata.get("explode") for info in infos):
            raise RuntimeError("device lost")
        hidden = self.table(padded)
        # "unused" is declared on an edge but never produced: it is delivered empty.
        return [{"hidden": hidden[i, :n]} for i, n in enumerate(lengths)]


class Codec(NodeSubmodule):
    """Hidden frames -> PCM samples (a transposed convolution, like a codec decoder)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.up = torch.nn.ConvTranspose1d(HIDDEN, 1, kernel_size=UPSAMPLE, stride=UPSAMPLE)
        self.calls = 0
        self.seen_chunks: list[dict] = []
        self.cleaned: list[str] = []

    def prepare_inputs(self, graph_walk, info, inputs):
        self.seen_chunks.append(dict(info.chunks))
        return inputs["hidden"][0]

    def preprocess(self, graph_walk, infos, prepared):
        return prepared

    def forward(self, graph_walk, infos, batch):
        self.calls += 1
        if any(info.request_kwargs.get("wrong_count") for info in infos):
            return []
        return [{"audio": self.up(h.t().unsqueeze(0)).reshape(-1), "hidden": h} for h in batch]

    def check_stop(self, graph_walk, info, outputs):
        if info.request_kwargs.get("fail_stop"):
            raise KeyError("no such loop state")
        return {"refine"} if info.step_metadata.get("iteration", 0) >= 1 else set()

    def cleanup_request(self, request_id):
        self.cleaned.append(request_id)


class TinyTTS(GraphModel):
    def __init__(self) -> None:
        self.embed = Embed()
        self.codec = Codec()

    def get_node_engine_types(self):
        return {"llm": EngineType.KV_CACHE, "embed": EngineType.STATELESS, "codec": EngineType.STATELESS}

    def get_graph_walk_graphs(self):
        embed = GraphNode("embed", ["codes"], [GraphEdge("codec", "hidden"), GraphEdge("codec", "unused")])
        codec = GraphNode(
            "codec",
            ["hidden"],
            [GraphEdge(EMIT_TO_CLIENT, "audio", output_modality="audio"), GraphEdge("codec", "hidden")],
        )
        return {"speak": Sequential([embed, Loop(codec, 2, name="refine")])}

    def get_submodule(self, node_name, device="cpu"):
        return {"embed": self.embed, "codec": self.codec}[node_name].to(device)

    def process_prompt(self, prompt, input_modalities, output_modalities, tensors=None, **kwargs):
        if kwargs.get("voice") == "nobody":
            raise ValueError("unknown voice 'nobody'")
        codes = torch.tensor([ord(c) % 32 for c in prompt], dtype=torch.int64)
        return {"codes": [codes], "speaker": [torch.ones(HIDDEN)]}

    def postprocess(self, output, modality, request_kwargs=None):
        if (request_kwargs or {}).get("fail_postprocess"):
            raise RuntimeError("cannot encode")
        return pcm_s16le(output)

    def get_output_sample_rate(self, modality="audio"):
        return SAMPLE_RATE


def pcm_s16le(samples: torch.Tensor) -> bytes:
    return (samples.detach().clamp(-1, 1) * 32767).round().to(torch.int16).numpy().astype("<i2").tobytes()


def codes_pass(pass_id: int, ids: list[int], **kwargs) -> NodePass:
    return NodePass(pass_id, pass_id, {"codes": [TokenIds(np.array(ids, dtype=np.int32))]}, **kwargs)


def release_outputs(runner: NodeRunner, results) -> None:
    for result in results:
        for values in result.outputs.values():
            runner.release_values(values)


# ---- batching ------------------------------------------------------------------------


def test_one_forward_for_the_whole_batch_with_per_request_outputs():
    model = TinyTTS()
    runner = NodeRunner(model)
    requests = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    results = runner.run("embed", "speak", [codes_pass(i, ids) for i, ids in enumerate(requests)])

    assert model.embed.calls == [3]
    assert [r.error for r in results] == [None, None, None]
    for ids, result in zip(requests, results):
        (hidden,) = result.outputs["hidden"]
        assert hidden == TensorDescriptor(hidden.handle, "float32", (len(ids), HIDDEN))
        # Batched with padding, each request gets exactly its own unbatched value.
        expected = model.embed.table(torch.tensor(ids))
        assert torch.equal(runner.store.get(hidden.handle), expected.detach())
        assert result.outputs["unused"] == []  # declared, not produced: an empty delivery
        assert result.client_chunks == [] and result.stops == []
    release_outputs(runner, results)
    assert len(runner.store) == 0 and runner.store.total_refs() == 0


def test_tensor_inputs_client_bytes_chunk_metadata_and_stops():
    model = TinyTTS()
    runner = NodeRunner(model)
    hidden = [torch.randn(3, HIDDEN), torch.randn(5, HIDDEN)]
    inputs = [runner.store.put(h) for h in hidden]
    chunk = ChunkInfo(index=2, start=14, context_count=21, final=True)
    passes = [
        NodePass(10, 1, {"hidden": [inputs[0]]}, chunks={"hidden": chunk}, step_metadata={"iteration": 0}),
        NodePass(11, 2, {"hidden": [inputs[1]]}, step_metadata={"iteration": 1}),
    ]
    results = runner.run("codec", "speak", passes)

    assert model.codec.calls == 1
    assert model.codec.seen_chunks == [{"hidden": chunk}, {}]
    assert [r.stops for r in results] == [[], ["refine"]]
    for h, result in zip(hidden, results):
        (audio_chunk,) = result.client_chunks
        expected = pcm_s16le(model.codec.up(h.t().unsqueeze(0)).reshape(-1))
        assert audio_chunk.data == expected and len(expected) == 2 * UPSAMPLE * len(h)
        assert (audio_chunk.name, audio_chunk.modality) == ("audio", "audio")
        assert audio_chunk.metadata == {"output": "audio", "sample_rate": SAMPLE_RATE}
        # "audio" only goes to the client, so it is not kept; the loop-back is.
        assert list(result.outputs) == ["hidden"]
        assert result.outputs["hidden"][0].shape == tuple(h.shape)

    # The conductor drops its references to inputs and outputs: nothing is left.
    runner.release_values(inputs)
    release_outputs(runner, results)
    assert len(runner.store) == 0 and runner.store.total_refs() == 0


# ---- failure isolation ---------------------------------------------------------------


def test_a_failing_prepare_inputs_fails_only_that_pass():
    model = TinyTTS()
    runner = NodeRunner(model)
    passes = [codes_pass(0, [1, 2]), codes_pass(1, [3], request_kwargs={"fail_prepare": True}), codes_pass(2, [4, 5])]
    results = runner.run("embed", "speak", passes)

    assert model.embed.calls == [2]  # the failed pass never entered the batch
    assert results[1].error == "node 'embed': prepare_inputs: ValueError: bad voice"
    assert results[1].outputs == {}
    assert results[0].error is None and results[2].error is None
    assert torch.equal(
        runner.store.get(results[2].outputs["hidden"][0].handle), model.embed.table(torch.tensor([4, 5])).detach()
    )
    release_outputs(runner, results)
    assert len(runner.store) == 0


def test_an_unknown_input_handle_fails_only_that_pass():
    runner = NodeRunner(TinyTTS())
    good = runner.store.put(torch.randn(2, HIDDEN))
    results = runner.run(
        "codec",
        "speak",
        [NodePass(0, 1, {"hidden": [TensorDescriptor(999, "float32", (2, HIDDEN))]}), NodePass(1, 2, {"hidden": [good]})],
    )
    assert "tensor handle 999 is not held by this worker" in results[0].error
    assert results[1].error is None
    release_outputs(runner, results)
    runner.release_values([good])
    assert len(runner.store) == 0


@pytest.mark.parametrize("stage, kwargs", [("check_stop", {"fail_stop": True}), ("postprocess", {"fail_postprocess": True})])
def test_a_failing_check_stop_or_postprocess_fails_only_that_pass_and_stores_nothing_for_it(stage, kwargs):
    model = TinyTTS()
    runner = NodeRunner(model)
    inputs = [runner.store.put(torch.randn(2, HIDDEN)) for _ in range(3)]
    passes = [NodePass(i, i, {"hidden": [h]}, request_kwargs=kwargs if i == 1 else {}) for i, h in enumerate(inputs)]
    results = runner.run("codec", "speak", passes)

    assert model.codec.calls == 1
    assert results[1].error.startswith(f"node 'codec': {stage}: ")
    assert results[1].outputs == {} and results[1].client_chunks == []
    assert [r.error is None for r in results] == [True, False, True]
    # Only the inputs and the two good passes' loop-backs are held.
    assert len(runner.store) == 3 + 2
    release_outputs(runner, results)
    runner.release_values(inputs)
    assert len(runner.store) == 0


def test_a_failing_forward_fails_the_whole_batch():
    model = TinyTTS()
    runner = NodeRunner(model)
    passes = [codes_pass(0, [1]), codes_pass(1, [2], step_metadata={"explode": True}), codes_pass(2, [3])]
    results = runner.run("embed", "speak", passes)
    assert model.embed.calls == [3]
    assert [r.error for r in results] == ["node 'embed': forward: RuntimeError: device lost"] * 3
    assert all(r.outputs == {} for r in results)
    assert len(runner.store) == 0


def test_forward_returning_the_wrong_number_of_outputs_fails_the_batch():
    runner = NodeRunner(TinyTTS())
    h = runner.store.put(torch.randn(2, HIDDEN))
    (result,) = runner.run("codec", "speak", [NodePass(0, 1, {"hidden": [h]}, request_kwargs={"wrong_count": True})])
    assert "forward must return one output dict per pass (1)" in result.error
    runner.release_values([h])
    assert len(runner.store) == 0


def test_caller_mistakes_raise():
    runner = NodeRunner(TinyTTS(), nodes=["codec"])
    with pytest.raises(ValueError, match="does not host stateless node 'embed'"):
        runner.run("embed", "speak", [])
    with pytest.raises(ValueError, match="walk 'other' has no node 'codec'"):
        runner.run("codec", "other", [])
    with pytest.raises(ValueError, match="'llm' is not a stateless node"):
        NodeRunner(TinyTTS(), nodes=["llm"])


# ---- admission, stored client outputs, lifetime ----------------------------------------


def test_process_prompt_returns_token_ids_inline_and_stores_tensors():
    runner = NodeRunner(TinyTTS())
    values = runner.process_prompt("hi", ["text"], ["audio"], None, voice="tara")
    (codes,) = values["codes"]
    assert isinstance(codes, TokenIds) and codes.ids.tolist() == [ord("h") % 32, ord("i") % 32]
    (speaker,) = values["speaker"]
    assert speaker == TensorDescriptor(speaker.handle, "float32", (HIDDEN,))
    assert runner.store.refs(speaker.handle) == 1
    runner.release_values(values["speaker"])
    assert len(runner.store) == 0

    with pytest.raises(ValueError, match="unknown voice"):
        runner.process_prompt("hi", ["text"], ["audio"], None, voice="nobody")
    assert len(runner.store) == 0


def test_postprocess_stored_makes_client_bytes_from_held_tensors():
    runner = NodeRunner(TinyTTS())
    samples = torch.tensor([0.0, 0.5, -1.0])
    held = runner.store.put(samples)
    (chunk,) = runner.postprocess_stored("audio", [held], "audio")
    assert chunk.data == pcm_s16le(samples) and chunk.metadata["sample_rate"] == SAMPLE_RATE
    assert runner.store.refs(held.handle) == 1  # releasing stays the conductor's call


def test_finish_request_lets_submodules_drop_their_state():
    model = TinyTTS()
    NodeRunner(model).finish_request("req-7")
    assert model.codec.cleaned == ["req-7"]


def test_tensor_store_reference_counts():
    store = TensorStore()
    d = store.put(torch.zeros(2, 3, dtype=torch.float16), refs=2)
    assert d.dtype == "float16" and d.shape == (2, 3)
    store.retain(d.handle)
    assert store.refs(d.handle) == 3 and store.total_refs() == 3
    assert store.release(d.handle) is False
    assert store.release(d.handle, 2) is True
    assert len(store) == 0 and d.handle not in store
    with pytest.raises(KeyError, match="released twice"):
        store.release(d.handle)
    with pytest.raises(KeyError, match="not held by this worker"):
        store.get(d.handle)
    e = store.put(torch.ones(1))
    assert e.handle != d.handle  # handles are never reused
    with pytest.raises(ValueError, match="releasing 2 references of 1"):
        store.release(e.handle, 2)


def test_default_postprocess_gives_the_tensors_raw_bytes_in_any_dtype():
    model = GraphModel()
    for dtype in (torch.float32, torch.int16, torch.bfloat16):
        t = torch.arange(6, dtype=dtype).reshape(2, 3)
        assert model.postprocess(t, "embedding") == t.reshape(-1).view(torch.uint8).numpy().tobytes()
    assert model.postprocess(torch.tensor(1.5), "embedding") == np.float32(1.5).tobytes()
