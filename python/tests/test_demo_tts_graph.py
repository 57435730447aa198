"""BatonDemoTTS as a graph, exported in the contract's layout (needs baton_worker.graph)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("baton_worker.graph.export")

from baton_worker.graph.export import export_graph  # noqa: E402
from baton_worker.models.demo_tts.build import build  # noqa: E402
from baton_worker.models.demo_tts.graph_model import BatonDemoTTS, CodecNode  # noqa: E402
from baton_worker.models.demo_tts.streaming import sliding_window_chunks  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return BatonDemoTTS(build(tmp_path_factory.mktemp("demo-tts")))


def test_exported_graph(model):
    g = export_graph(model)
    json.dumps(g)  # plain data
    assert {n["name"]: n["engine"] for n in g["nodes"]} == {"llm": "kv_cache", "codec": "stateless"}
    # end-of-audio stops the llm's decode loop (the engine core's stop checker reads this)
    assert {n["name"]: n["stop_token_ids"] for n in g["nodes"]} == {"llm": [258], "codec": []}
    assert model.get_kv_model_dir("llm") == model.model_dir / "llm"
    assert {w["name"]: w["partition"] for w in g["walks"]} == {"prefill": "llm", "decode": "llm", "codec_chunk": "codec"}
    (loop,) = [s for s in g["sections"] if s["kind"] == "loop"]
    assert (loop["loop_name"], loop["max_iters"]) == ("decode_loop", 2048)
    assert g["connections"] == [
        {
            "from_partition": "llm",
            "to_partition": "codec",
            "edge_name": "new_token",
            "policy": {"kind": "sliding_window", "size": 16, "stride": 4, "left": 0, "continue_after_done": False},
        }
    ]
    assert g["client_outputs"] == [{"name": "audio_chunk", "modality": "audio"}]
    parts = {p["name"]: p for p in g["partitions"]}
    assert parts["llm"]["start"]["walk"] == "prefill"
    assert parts["llm"]["after"]["prefill"]["walk"] == "decode"
    assert parts["llm"]["after"]["decode"]["walk"] == ""
    assert parts["codec"]["start"]["walk"] == "codec_chunk" and parts["codec"]["after"]["codec_chunk"]["walk"] == "codec_chunk"
    assert not any(p["python_transitions"] for p in g["partitions"])


def test_prompt_postprocess_and_submodules(model):
    (ids,) = model.process_prompt("hi", ["text"], ["audio"], voice="shimmer")["text_inputs"]
    assert ids.tolist() == [256, 264, 104, 105, 257]
    with pytest.raises(ValueError, match="valid voices"):
        model.process_prompt("hi", ["text"], ["audio"], voice="hal")
    assert model.postprocess(torch.tensor([0.5, -2.0]), "audio", {}) == b"\x00\x40\x01\x80"
    assert isinstance(model.get_submodule("codec", "cpu"), CodecNode)
    assert model.get_submodule("llm", "cpu") is None
    assert model.get_output_sample_rate() == 24000


def test_codec_node_runs_a_batch_of_chunk_passes(model):
    """The node under the runner's contract gives the bytes the reference's CodecStream gives."""
    node = model.get_submodule("codec", "cpu")
    ids = torch.arange(265, 265 + 21)
    passes = []
    for chunk, length in sliding_window_chunks(21, 16, 4):
        info = type("Info", (), {"chunks": {"new_token": chunk}})()
        items = ids[chunk.start : chunk.start + length]
        # one tensor per item for some passes, one for the whole chunk for others
        inputs = {"new_token": list(items.split(1)) if chunk.index % 2 else [items]}
        passes.append((node.prepare_inputs("codec_chunk", info, inputs), (items, chunk)))
    outputs = node("codec_chunk", [], node.preprocess("codec_chunk", [], [p for p, _ in passes]))
    alone = [node.stream([items], [chunk])[0] for _, (items, chunk) in passes]
    assert [len(o["audio_chunk"]) for o in outputs] == [1, 1, 0]  # 4 frames, frame 4, nothing new
    for out, pcm in zip(outputs, alone, strict=True):
        assert all(torch.equal(a, pcm) for a in out["audio_chunk"])
