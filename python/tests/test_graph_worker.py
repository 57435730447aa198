"""A worker hosting graph nodes, driven through wire Steps (GraphStepRunner).

The demo TTS model end to end inside one worker: prompt requests give the
model's prompt ids, the llm's KV rows sample the reference's tokens, and codec
pass batches over the chunks the sliding-window policy yields (batched across
requests, in the same Steps as the rows) give the reference's PCM bytes. Then
failure isolation, tensor lifetimes (releases, finished requests), workers
that host part of the graph (real processes over ZeroMQ), and the wire form of
the new messages."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from baton_worker import protocol
from baton_worker.model.config import ConfigError
from baton_worker.graph import EMIT_TO_CLIENT, EngineType, GraphEdge, GraphModel, GraphNode, LLMGraphModel, Sequential
from baton_worker.graph.export import export_graph
from baton_worker.graph.node_runner import NodeRunner, NodeSubmodule
from baton_worker.graph.worker_runner import GraphStepRunner
from baton_worker.runtime.loading import load_worker
from baton_worker.models.demo_tts.build import build
from baton_worker.models.demo_tts.graph_model import BatonDemoTTS
from baton_worker.models.demo_tts.reference import Reference
from baton_worker.models.demo_tts.streaming import StreamChunk, sliding_window_chunks
from baton_worker.models.demo_tts.text import prompt_ids
from baton_worker.runtime.options import OptionsError, WorkerOptions, parse_options
from baton_worker.protocol import (
    AddedRequest,
    GraphWork,
    ChunkPosition,
    NamedValues,
    NodePass,
    PassBatch,
    PromptRequest,
    ProtocolError,
    SamplingParams,
    Step,
    WireValue,
)
from test_server import Engine, _expect_fatal

REPO = Path(__file__).resolve().parents[2]
TEXT = "Hello from Baton."
STOPPING_SEED = 216  # with TEXT and "nova", seeded T=1 sampling ends by end-of-audio after 63 tokens
BLOCK_SIZE = 8

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    built = REPO / "models" / "demo-tts"  # built by setup; the builder is deterministic
    return built if (built / "config.json").is_file() else build(tmp_path_factory.mktemp("demo-tts"))


@pytest.fixture(scope="module")
def ref(model_dir):
    return Reference(model_dir)


def load(model_dir, **options):
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=BLOCK_SIZE, dtype="float32")
    for name, value in options.items():
        setattr(opts, name, value)
    return load_worker(opts)


def i32(values=()):
    return np.array(list(values), np.int32)


def graph_step(step_id=-1, prompts=(), batches=(), releases=(), finished=()):
    e = i32()
    work = GraphWork(list(prompts), list(batches), i32(releases), i32(finished))
    return Step(step_id, [], e, e, e, e, e, e, np.zeros(0, np.uint8), graph=work)


def run(runner, step):
    """Through the real codec both ways, as the server sees it."""
    return protocol.decode(protocol.encode(runner.execute(protocol.decode(protocol.encode(step)))))


def tokens(ids):
    return WireValue("tokens", ids=i32(ids))


def position(name, chunk):
    return ChunkPosition(name, chunk.index, chunk.start, chunk.context_count, chunk.final)


def codec_pass(pass_id, request_id, items, chunk, kwargs=None, values=None):
    return NodePass(
        pass_id,
        request_id,
        [NamedValues("new_token", values if values is not None else [tokens(items)])],
        [position("new_token", chunk)] if chunk is not None else [],
        {"voice": "nova"} if kwargs is None else kwargs,
    )


def pcm_of(result):
    return b"".join(bytes(c.data) for c in result.client_chunks)


# ---- prompts ------------------------------------------------------------------------------


def test_a_prompt_request_gives_the_models_prompt_ids_and_a_bad_one_fails_alone(model_dir):
    worker = load(model_dir, num_blocks=64)
    layout = BatonDemoTTS(model_dir).spec.tokens
    result = run(
        worker.graph_runner,
        graph_step(
            prompts=[
                PromptRequest(1, TEXT, ["text"], ["audio"], {"voice": "nova"}),
                PromptRequest(2, TEXT, ["text"], ["audio"], {"voice": "hal"}),
                PromptRequest(3, None, ["text"], ["audio"], {}),
            ]
        ),
    )
    assert result.step_id == -1 and len(result.req_ids) == 0
    a, b, c = result.prompt_results
    assert (a.request_id, a.error, [v.name for v in a.values]) == (1, None, ["text_inputs"])
    (value,) = a.values[0].values
    assert value.form == "tokens" and value.ids.tolist() == prompt_ids(TEXT, "nova", layout)
    assert b.request_id == 2 and b.values == []
    assert b.error.startswith("process_prompt: ValueError: unknown voice 'hal'; valid voices: alloy") and "\n" not in b.error
    assert c.values[0].values[0].ids.tolist() == prompt_ids("", None, layout)  # no text, default voice
    assert len(worker.graph_runner.nodes.store) == 0  # token ids travel inline


# ---- the pipeline inside one worker: llm rows and codec batches in the same Steps ---------


@dataclass
class Speech:
    request_id: int  # the one id: the rows' req_id and the graph work's request_id
    seed: int
    temperature: float
    max_tokens: int
    prompt: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the stream: every sampled id, a stop id included
    computed: int = 0
    blocks: int = 0
    added: bool = False
    done: bool = False  # the llm's decode loop stopped
    sent: list[tuple[StreamChunk, int]] = field(default_factory=list)  # chunks handed to the codec
    chunk_pcm: list[bytes] = field(default_factory=list)
    finished: bool = False  # the final chunk's pass completed


class Pipeline:
    """What the conductor and engine core do for the demo TTS, reduced to one worker:
    rows for the llm (prefill, then one decode row per step; stop on the node's
    exported stop ids or the token cap), and each step a codec batch with the
    next chunk of every request that has one (full windows while the llm runs,
    the rest once it stopped)."""

    def __init__(self, worker, window: int, stride: int):
        self.runner = worker.graph_runner
        nodes = {n["name"]: n for n in worker.ready.graph["nodes"]}
        self.stop_ids = set(nodes["llm"]["stop_token_ids"])
        self.window, self.stride = window, stride
        self.next_block = 0
        self.step_id = 0
        self.pass_id = 0
        self.batch_sizes: list[int] = []

    def run(self, speeches: list[Speech]) -> None:
        prompts = [PromptRequest(s.request_id, TEXT, ["text"], ["audio"], {"voice": "nova"}) for s in speeches]
        for s, result in zip(speeches, run(self.runner, graph_step(-1, prompts)).prompt_results, strict=True):
            assert result.error is None
            s.prompt = result.values[0].values[0].ids.tolist()
        removed: list[int] = []
        finished: list[str] = []
        while not all(s.finished for s in speeches) or removed or finished:
            removed, finished = self.step(speeches, removed, finished)

    def step(self, speeches, removed, finished):
        rows, added, counts, new_ids = [], [], [], []
        for s in speeches:
            if s.done:
                continue
            known = len(s.prompt) + len(s.tokens)
            if not s.added:
                s.added = True
                added.append(AddedRequest(s.request_id, i32(s.prompt), len(s.prompt), SamplingParams(s.temperature, seed=s.seed)))
            need = -(-known // BLOCK_SIZE) - s.blocks
            new_ids += range(self.next_block, self.next_block + need)
            self.next_block += need
            s.blocks += need
            counts.append(need)
            rows.append((s, known - s.computed))
        passes, by_pass = [], {}
        for s in speeches:
            chunk = self.next_chunk(s)
            if chunk is not None:
                (info, length), start = chunk, chunk[0].start
                passes.append(codec_pass(self.pass_id, s.request_id, s.tokens[start : start + length], info))
                by_pass[self.pass_id] = (s, info)
                s.sent.append(chunk)
                self.pass_id += 1
        if passes:
            self.batch_sizes.append(len(passes))
        step = Step(
            self.step_id,
            added,
            i32(removed),
            i32(s.request_id for s, _ in rows),
            i32(n for _, n in rows),
            i32(s.computed for s, _ in rows),
            i32(counts),
            i32(new_ids),
            np.ones(len(rows), np.uint8),
            graph=GraphWork(batches=[PassBatch(self.step_id, "codec", "codec_chunk", passes)] if passes else [], finished_requests=i32(finished)),
        )
        self.step_id += 1
        result = run(self.runner, step)
        by_req = {s.request_id: s for s, _ in rows}
        removed, finished = [], []
        for s, n in rows:
            s.computed += n
        for req_id, token in zip(result.req_ids.tolist(), result.token_ids.tolist(), strict=True):
            s = by_req[req_id]
            s.tokens.append(token)
            if token in self.stop_ids or len(s.tokens) >= s.max_tokens:
                s.done = True
                removed.append(req_id)
        assert [r.pass_id for r in result.pass_results] == [p.pass_id for p in passes]
        for r in result.pass_results:
            s, info = by_pass[r.pass_id]
            assert r.error is None and r.outputs == [] and r.stops == []
            assert all(c.metadata == {"output": "audio_chunk", "sample_rate": 24000} for c in r.client_chunks)
            s.chunk_pcm.append(pcm_of(r))
            if info.final:
                s.finished = True
                finished.append(s.request_id)
        return removed, finished

    def next_chunk(self, s: Speech):
        if s.finished or (s.sent and s.sent[-1][0].final):
            return None
        index = len(s.sent)
        if not s.done:  # a full window, once its items exist
            start = index * self.stride
            if len(s.tokens) < start + self.window:
                return None
            return StreamChunk(index, start, 0 if index == 0 else self.window - self.stride, False), self.window
        return sliding_window_chunks(len(s.tokens), self.window, self.stride)[index]


def test_the_demo_tts_pipeline_in_one_worker_gives_the_references_tokens_and_pcm(model_dir, ref):
    worker = load(model_dir, num_blocks=64)
    stream = ref.spec.stream
    speeches = [
        Speech(1, STOPPING_SEED, 1.0, 80),
        Speech(2, 7, 1.0, 40),
        Speech(3, 123, 0.8, 30),
    ]
    pipeline = Pipeline(worker, stream.window_tokens, stream.stride_tokens)
    pipeline.run(speeches)
    for s in speeches:
        expected, reason = ref.generate(s.prompt, s.max_tokens, s.temperature, s.seed)
        assert s.tokens == expected, s.request_id
        # Streamed windows then the tail are exactly the policy's chunks for the final count...
        assert s.sent == sliding_window_chunks(len(s.tokens), stream.window_tokens, stream.stride_tokens)
        # ...and each chunk's bytes are the reference's for that chunk.
        assert s.chunk_pcm == ref.decode(s.tokens), s.request_id
    assert speeches[0].tokens[-1] == ref.spec.tokens.end_of_audio and len(speeches[0].tokens) == 63
    assert len(speeches[1].tokens) == 40 and sum(map(len, speeches[1].chunk_pcm)) == 40 // 4 * 960
    assert max(pipeline.batch_sizes) == 3  # the codec ran the three requests' chunks as one batch
    # Every request was removed and finished: nothing is left on the worker.
    assert worker.runner.requests == {} and len(worker.graph_runner.nodes.store) == 0


# ---- failure isolation ----------------------------------------------------------------------


def test_a_bad_pass_fails_alone_and_a_batch_the_worker_cannot_run_fails_whole(model_dir, ref):
    worker = load(model_dir, num_blocks=16)
    runner = worker.graph_runner
    stream = ref.spec.stream
    items = [265 + (7 * i) % 320 for i in range(20)]
    (first, length), *_ = sliding_window_chunks(len(items), stream.window_tokens, stream.stride_tokens)
    window = items[:length]
    held = runner.nodes.store.put(torch.tensor(window, dtype=torch.int64))
    good = [
        codec_pass(1, 1, window, first),
        codec_pass(6, 6, None, first, values=[WireValue("tensor", held.handle, 0, dtype="int64", shape=[length])]),
    ]
    bad = [
        codec_pass(2, 2, None, first, values=[WireValue("tensor", 17, 1, dtype="int64", shape=[16])]),
        codec_pass(3, 3, None, first, values=[WireValue("tensor", 999, 0, dtype="int64", shape=[16])]),
        codec_pass(4, 4, window, None),
        codec_pass(5, 5, window, first, kwargs=["voice"]),
        codec_pass(7, 7, None, first, values=[WireValue("blob")]),
    ]
    result = run(
        runner,
        graph_step(
            batches=[
                PassBatch(1, "codec", "codec_chunk", [good[0], *bad, good[1]]),
                PassBatch(2, "llm", "decode", [codec_pass(10, 10, window, first)]),
                PassBatch(3, "vae", "codec_chunk", [codec_pass(11, 11, window, first)]),
                PassBatch(4, "codec", "decode", [codec_pass(12, 12, window, first), codec_pass(13, 13, window, first)]),
            ]
        ),
    )
    errors = {r.pass_id: r.error for r in result.pass_results}
    assert list(errors) == [1, 2, 3, 4, 5, 7, 6, 10, 11, 12, 13]
    expected = ref.decode(items)[0]
    by_id = {r.pass_id: r for r in result.pass_results}
    assert errors[1] is None and pcm_of(by_id[1]) == expected
    assert errors[6] is None and pcm_of(by_id[6]) == expected  # a tensor input held here
    assert errors[2] == (
        "node 'codec': inputs: input 'new_token': tensor handle 17 lives on worker 1, "
        "which did not publish it to shared memory"
    )
    assert errors[3] == "node 'codec': inputs: input 'new_token': tensor handle 999 is not held by worker 0"
    assert errors[4].startswith("node 'codec': prepare_inputs: KeyError: 'new_token'")
    assert errors[5] == "node 'codec': inputs: request_kwargs must be a map, got list"
    assert errors[7] == "node 'codec': inputs: input 'new_token': unknown value form 'blob' (tokens, tensor or empty)"
    assert errors[10] == "node 'llm' is a kv_cache node: the engine core runs it through a step's rows, not a pass batch"
    assert errors[11] == "BatonDemoTTS has no node 'vae' (nodes: llm, codec)"
    assert errors[12] == errors[13] == "node 'codec': ValueError: walk 'decode' has no node 'codec'"
    assert all("\n" not in e for e in errors.values() if e)
    # The failed passes stored nothing; the test's own tensor is still held, once.
    assert len(runner.nodes.store) == 1 and runner.nodes.store.refs(held.handle) == 1


class Double(NodeSubmodule):
    """x -> h = 2x (stored, for `tail`); a negative input makes forward raise (a broken batch)."""

    def forward(self, graph_walk, infos, batch):
        if any(float(inputs["x"][0].min()) < 0 for inputs in batch):
            raise RuntimeError("device lost\nwhile doubling")
        return [{"h": [inputs["x"][0] * 2]} for inputs in batch]


class Tail(NodeSubmodule):
    """h -> y = h + 1 for the client; stops `rounds` when the request asks."""

    def __init__(self):
        super().__init__()
        self.cleaned: list[str] = []

    def forward(self, graph_walk, infos, batch):
        return [{"y": [inputs["h"][0] + 1]} for inputs in batch]

    def check_stop(self, graph_walk, info, outputs):
        return {"rounds"} if info.request_kwargs.get("stop") else set()

    def cleanup_request(self, request_id):
        self.cleaned.append(request_id)


class Toy(GraphModel):
    """Two stateless nodes; process_prompt returns a stored tensor beside token ids."""

    def __init__(self):
        self.modules = {"double": Double(), "tail": Tail()}

    def get_node_engine_types(self):
        return {"double": EngineType.STATELESS, "tail": EngineType.STATELESS}

    def get_graph_walk_graphs(self):
        return {
            "main": Sequential(
                [
                    GraphNode("double", ["x"], [GraphEdge("tail", "h")]),
                    GraphNode("tail", ["h"], [GraphEdge(EMIT_TO_CLIENT, "y", output_modality="audio")]),
                ]
            )
        }

    def get_submodule(self, node_name, device="cpu"):
        return self.modules[node_name]

    def process_prompt(self, prompt, input_modalities, output_modalities, tensors=None, **kwargs):
        if prompt == "boom":
            raise ValueError("no\nsuch prompt")
        x = torch.tensor(kwargs["x"], dtype=torch.float32)
        if prompt == "half":  # one tensor stored, then a bad value: nothing may stay behind
            return {"x": [x], "bad": [3]}
        return {"x": [x], "ids": [torch.tensor([5, 6], dtype=torch.int64)]}


def test_tensor_lifetimes_and_a_failing_forward_with_a_worker_of_rank_3():
    model = Toy()
    runner = GraphStepRunner(NodeRunner(model, "cpu"), rank=3)
    store = runner.nodes.store
    prompts = [
        PromptRequest(1, "go", ["audio"], ["audio"], {"x": [1.0, 2.0]}),
        PromptRequest(2, "go", ["audio"], ["audio"], {"x": [-1.0]}),
        PromptRequest(3, "boom", ["audio"], ["audio"], {}),
        PromptRequest(4, "half", ["audio"], ["audio"], {"x": [4.0]}),
    ]
    p1, p2, p3, p4 = run(runner, graph_step(prompts=prompts)).prompt_results
    x1, ids1 = p1.values
    assert (x1.name, ids1.name) == ("x", "ids") and ids1.values[0].form == "tokens" and ids1.values[0].ids.tolist() == [5, 6]
    (tensor,) = x1.values
    assert (tensor.form, tensor.worker, tensor.dtype, tensor.shape) == ("tensor", 3, "float32", [2])
    assert p3.error == "process_prompt: ValueError: no such prompt" and p3.values == []
    assert p4.error == "process_prompt: TypeError: process_prompt value 'bad' holds a int, not a tensor"
    assert len(store) == 2 and store.total_refs() == 2  # p1's and p2's x; p4 left nothing

    def x_pass(pass_id, request_id, value):
        return NodePass(pass_id, request_id, [NamedValues("x", [value])])

    # Two batches in one step: p2's negative input breaks its forward, p1's batch is untouched.
    result = run(
        runner,
        graph_step(
            batches=[
                PassBatch(1, "double", "main", [x_pass(1, 1, tensor)]),
                PassBatch(2, "double", "main", [x_pass(2, 2, p2.values[0].values[0])]),
            ]
        ),
    )
    ok, broken = result.pass_results
    assert broken.error == "node 'double': forward: RuntimeError: device lost while doubling"
    assert ok.error is None and [o.name for o in ok.outputs] == ["h"]
    (h,) = ok.outputs[0].values
    assert (h.form, h.worker, h.dtype, h.shape) == ("tensor", 3, "float32", [2])

    # The x tensors are released in the same step that consumes h; y goes to the client as bytes.
    x_handles = [tensor.handle, p2.values[0].values[0].handle]
    result = run(
        runner,
        graph_step(
            batches=[PassBatch(3, "tail", "main", [NodePass(3, 1, [NamedValues("h", [h])], request_kwargs={"stop": True})])],
            releases=x_handles,
        ),
    )
    (done,) = result.pass_results
    assert done.error is None and done.outputs == [] and done.stops == ["rounds"]
    (chunk,) = done.client_chunks
    assert (chunk.name, chunk.modality) == ("y", "audio")
    assert np.frombuffer(bytes(chunk.data), np.float32).tolist() == [3.0, 5.0]
    assert len(store) == 1

    # Releasing a handle twice is the control plane's bug: the step is refused and changes nothing.
    with pytest.raises(ProtocolError, match=r"^Step\.graph\.releases\[1\]: tensor handle \d+ is not held by worker 3"):
        runner.execute(graph_step(releases=[h.handle, h.handle]))
    assert len(store) == 1

    run(runner, graph_step(releases=[h.handle], finished=[1, 2]))
    assert len(store) == 0 and store.total_refs() == 0
    assert model.modules["tail"].cleaned == [1, 2]

    # KV rows on a worker without a kv_cache node are a protocol error naming the field.
    rows = graph_step()
    rows.req_ids = i32([1])
    with pytest.raises(ProtocolError, match=r"^Step\.req_ids: worker 3 hosts no kv_cache node \(it hosts double, tail\)"):
        runner.execute(rows)


# ---- workers that host part of the graph ----------------------------------------------------


@pytest.fixture
def spawn(tmp_path):
    """Real worker processes, each with its own sockets (test_server's Engine); killed at the end."""
    engines = []

    def start(*args: str) -> Engine:
        sockets = tmp_path / str(len(engines))
        sockets.mkdir()
        engines.append(Engine(sockets, list(args)))
        return engines[-1]

    yield start
    for engine in engines:
        engine.close()


def test_nodes_and_rank_options():
    base = ["--model", "m", "--in-endpoint", "a", "--out-endpoint", "b", "--block-size", "8"]
    opts = parse_options(base)
    assert (opts.nodes, opts.rank) == (None, 0)
    opts = parse_options([*base, "--nodes", "llm, codec", "--rank", "2"])
    assert (opts.nodes, opts.rank) == (["llm", "codec"], 2)
    for args, message in [
        (["--nodes", "llm,,codec"], "--nodes 'llm,,codec' has an empty node name"),
        (["--nodes", "codec,codec"], "--nodes 'codec,codec' names codec more than once"),
        (["--rank", "-1"], "--rank must be >= 0, got -1"),
    ]:
        with pytest.raises(OptionsError, match=message):
            parse_options([*base, *args])


def test_load_worker_hosts_the_nodes_it_is_given(model_dir):
    graph = export_graph(BatonDemoTTS(model_dir))
    both = load(model_dir, num_blocks=64)
    assert both.nodes == ["llm", "codec"] and both.ready.graph == graph
    assert (both.ready.num_blocks, both.ready.max_model_len, both.ready.vocab_size) == (64, 512, 585)
    codec = load(model_dir, nodes=["codec"], rank=1, max_model_len=1024)
    assert codec.runner is None and codec.config is None and codec.nodes == ["codec"]
    r = codec.ready
    assert (r.num_blocks, r.block_size, r.max_model_len, r.vocab_size) == (0, BLOCK_SIZE, 1024, 0)
    assert (r.architecture, r.dtype, r.graph) == ("BatonDemoTTS", "float32", graph)
    with pytest.raises(ConfigError, match=r"^--nodes names 'vae', 'llm2', which BatonDemoTTS does not have; its nodes: llm, codec$"):
        load(model_dir, nodes=["codec", "vae", "llm2"])


def test_a_plain_llm_is_still_the_one_node_graph_and_has_only_llm(model_dir):
    llm = load(model_dir / "llm", num_blocks=32)
    assert llm.nodes == ["llm"] and llm.ready.architecture == "LlamaForCausalLM"
    assert llm.ready.graph == export_graph(LLMGraphModel(256))
    with pytest.raises(ConfigError, match=r"^--nodes names 'codec', which LlamaForCausalLM \(a plain LLM\) does not have"):
        load(model_dir / "llm", nodes=["codec"])


def _chunks_for(ref, items):
    s = ref.spec.stream
    return sliding_window_chunks(len(items), s.window_tokens, s.stride_tokens)


def test_an_llm_worker_and_a_codec_worker_split_the_model(spawn, model_dir, ref):
    """Both as real processes: the llm worker samples, the codec worker decodes the
    reference's tokens into the reference's bytes; each refuses the other's work."""
    codec = spawn("--model", str(model_dir), "--block-size", "8", "--nodes", "codec", "--rank", "1", "--dtype", "float32")
    llm = spawn("--model", str(model_dir), "--block-size", "8", "--num-blocks", "32", "--nodes", "llm", "--seed", "5")
    codec_ready, llm_ready = codec.recv(), llm.recv()
    assert isinstance(codec_ready, protocol.Ready) and isinstance(llm_ready, protocol.Ready), (codec_ready, llm_ready)
    assert (codec_ready.num_blocks, codec_ready.block_size, codec_ready.max_model_len, codec_ready.vocab_size) == (0, 8, 0, 0)
    assert (llm_ready.num_blocks, llm_ready.block_size, llm_ready.max_model_len, llm_ready.vocab_size) == (32, 8, 256, 585)
    assert codec_ready.architecture == llm_ready.architecture == "BatonDemoTTS"
    assert codec_ready.graph == llm_ready.graph == json.loads(json.dumps(export_graph(BatonDemoTTS(model_dir))))

    # Two requests' chunks, one batch per step, on the codec worker.
    streams = {request_id: ref.generate(prompt_ids(TEXT, "nova", ref.spec.tokens), 24, 1.0, seed)[0] for request_id, seed in [(1, 1), (2, 9)]}
    chunks = {name: _chunks_for(ref, items) for name, items in streams.items()}
    got: dict[int, list[bytes]] = {name: [] for name in streams}
    for k in range(max(map(len, chunks.values()))):
        passes = [
            codec_pass(10 * k + i, name, streams[name][c.start : c.start + n], c)
            for i, name in enumerate(streams)
            if k < len(chunks[name])
            for c, n in [chunks[name][k]]
        ]
        codec.send(graph_step(-1 - k, batches=[PassBatch(k, "codec", "codec_chunk", passes)]))
        result = codec.recv()
        assert result.step_id == -1 - k and [r.error for r in result.pass_results] == [None] * len(passes)
        for p, r in zip(passes, result.pass_results, strict=True):
            got[p.request_id].append(pcm_of(r))
    assert got == {name: ref.decode(items) for name, items in streams.items()}

    # The llm worker runs rows; a codec batch sent to it fails per pass.
    prompt = i32(prompt_ids(TEXT, "nova", ref.spec.tokens))
    added = AddedRequest(7, prompt, len(prompt), SamplingParams(temperature=0.0))
    blocks = -(-len(prompt) // 8)
    step = Step(0, [added], i32(), i32([7]), i32([len(prompt)]), i32([0]), i32([blocks]), i32(range(blocks)), np.ones(1, np.uint8),
                graph=GraphWork(batches=[PassBatch(0, "codec", "codec_chunk", [codec_pass(1, 1, streams[1][:16], chunks[1][0][0])])]))
    llm.send(step)
    result = llm.recv()
    assert result.req_ids.tolist() == [7] and result.token_ids.tolist() == ref.generate(prompt.tolist(), 1, 0.0, None)[0]
    assert result.pass_results[0].error == "node 'codec' is not hosted by worker 0 (it hosts llm)"
    llm.send(protocol.Shutdown())
    assert llm.wait()[0] == 0

    # Rows sent to the codec worker are fatal, naming the field.
    codec.send(step)
    _expect_fatal(codec, "Step.added: worker 1 hosts no kv_cache node (it hosts codec)")


def test_unknown_nodes_are_a_fatal_line(spawn, model_dir):
    engine = spawn("--model", str(model_dir), "--block-size", "8", "--nodes", "codec,vocoder")
    _expect_fatal(engine, "--nodes names 'vocoder', which BatonDemoTTS does not have; its nodes: llm, codec")


# ---- the wire --------------------------------------------------------------------------------


def test_graph_messages_round_trip_through_the_codec():
    step = graph_step(
        -4,
        prompts=[PromptRequest(5, None, ["text"], ["audio"], {"voice": "echo", "seed": 3})],
        batches=[
            PassBatch(2, "codec", "codec_chunk", [
                NodePass(9, 5, [NamedValues("new_token", [tokens([1, 2]), WireValue("empty"),
                                                            WireValue("tensor", 4, 1, dtype="float32", shape=[2, 3])])],
                         [ChunkPosition("new_token", 1, 4, 12, True)], {"voice": "echo"}),
            ])
        ],
        releases=[3, 4],
        finished=[7],
    )
    again = protocol.decode(protocol.encode(step))
    assert protocol.to_plain(again) == protocol.to_plain(step)
    result = protocol.StepResult(
        -4, i32(), i32(), None, None, None, None, protocol.StepTimings(0.5, 1.25, 0.0),
        prompt_results=[protocol.PromptResult(5, None, [NamedValues("text_inputs", [tokens([256, 257])])])],
        pass_results=[
            protocol.PassResult(9, None, [NamedValues("h", [WireValue("tensor", 8, 1, dtype="float32", shape=[480])])],
                                [protocol.ClientChunk("audio_chunk", "audio", np.frombuffer(b"\x01\x02", np.uint8), {"sample_rate": 24000})],
                                ["decode_loop"]),
            protocol.PassResult(10, "node 'codec': forward: RuntimeError: x"),
        ],
    )
    assert protocol.to_plain(protocol.decode(protocol.encode(result))) == protocol.to_plain(result)


def test_the_golden_ready_graph_is_what_the_llm_graph_exports():
    golden = json.loads((REPO / "protocol" / "golden" / "ready.json").read_text())
    assert golden["value"]["graph"] == export_graph(LLMGraphModel(4096))
