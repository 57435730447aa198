"""The authoring API and the exported layout the TypeScript compiler reads.

Graphs here are shaped like M*'s real ones (Orpheus TTS, BAGEL's CFG loop,
V-JEPA 2's rollout, nested loops); the expected dicts are written out in full so
a change to the layout shows up as a diff against the contract."""

from __future__ import annotations

import json

import msgpack
import pytest

from baton_worker.graph import (
    EMIT_TO_CLIENT,
    EMPTY_DESTINATION,
    ConductorMetadata,
    Connection,
    EngineType,
    FixedChunkPolicy,
    ForwardPassArgs,
    GraphDeclarationError,
    GraphEdge,
    GraphModel,
    GraphNode,
    LeftContextChunkPolicy,
    LLMGraphModel,
    Loop,
    Parallel,
    PartitionTopology,
    PartitionTransitions,
    Sequential,
    SlidingWindowChunkPolicy,
    StreamingGraphEdge,
    WalkInput,
    WalkStep,
    export_graph,
)


# ---- row builders: every key of the layout, so goldens stay exact but readable ----


def edge(to, name, persist=False, new_token=False, modality="", target=""):
    return {
        "to": to,
        "name": name,
        "persist": persist,
        "new_token": new_token,
        "modality": modality,
        "target_partition": target,
    }


def node_row(node, inputs, outputs):
    return {
        "kind": "node",
        "node": node,
        "inputs": inputs,
        "outputs": outputs,
        "accumulated_outputs": [],
        "children": [],
        "loop_name": "",
        "max_iters": 0,
    }


def group_row(kind, children):
    return {
        "kind": kind,
        "node": "",
        "inputs": [],
        "outputs": [],
        "accumulated_outputs": [],
        "children": children,
        "loop_name": "",
        "max_iters": 0,
    }


def loop_row(body, name, max_iters, outputs=(), accumulated=()):
    return {
        "kind": "loop",
        "node": "",
        "inputs": [],
        "outputs": list(outputs),
        "accumulated_outputs": list(accumulated),
        "children": [body],
        "loop_name": name,
        "max_iters": max_iters,
    }


def walk_step(walk, inputs=(), release=()):
    return {
        "walk": walk,
        "inputs": [
            {"node": n, "name": i, "source": s, "source_name": sn} for n, i, s, sn in inputs
        ],
        "release": list(release),
    }


def round_trips(graph: dict) -> None:
    assert json.loads(json.dumps(graph)) == graph
    packed = msgpack.packb(graph)
    assert msgpack.unpackb(packed) == graph


# ---- the plain LLM --------------------------------------------------------------------


def test_llm_graph_exports_one_kv_node_with_prefill_and_decode():
    graph = export_graph(LLMGraphModel(max_model_len=4096))
    assert graph == {
        "version": 1,
        "nodes": [{"name": "llm", "engine": "kv_cache", "overlap": True, "stop_token_ids": [], "kv_inputs": ["embeds", "positions"], "frame_width": 0}],
        "sections": [
            {
                "kind": "node",
                "node": "llm",
                "inputs": ["text_inputs"],
                "outputs": [
                    {"to": "", "name": "new_token", "persist": True, "new_token": True, "modality": "", "target_partition": ""},
                    {"to": "emit_to_client", "name": "new_token", "persist": False, "new_token": False, "modality": "text", "target_partition": ""},
                ],
                "accumulated_outputs": [],
                "children": [],
                "loop_name": "",
                "max_iters": 0,
            },
            {
                "kind": "loop",
                "node": "",
                "inputs": [],
                "outputs": [],
                "accumulated_outputs": [],
                "children": [2],
                "loop_name": "decode_loop",
                "max_iters": 4096,
            },
            {
                "kind": "node",
                "node": "llm",
                "inputs": ["text_inputs"],
                "outputs": [
                    {"to": "llm", "name": "text_inputs", "persist": False, "new_token": False, "modality": "", "target_partition": ""},
                    {"to": "emit_to_client", "name": "new_token", "persist": False, "new_token": False, "modality": "text", "target_partition": ""},
                ],
                "accumulated_outputs": [],
                "children": [],
                "loop_name": "",
                "max_iters": 0,
            },
        ],
        "walks": [
            {"name": "prefill", "partition": "default", "root": 0},
            {"name": "decode", "partition": "default", "root": 1},
        ],
        "partitions": [
            {
                "name": "default",
                "walks": ["prefill", "decode"],
                "start": {
                    "walk": "prefill",
                    "inputs": [{"node": "llm", "name": "text_inputs", "source": "prompt", "source_name": "text_inputs"}],
                    "release": [],
                },
                "after": {
                    "prefill": {
                        "walk": "decode",
                        "inputs": [{"node": "llm", "name": "text_inputs", "source": "persist", "source_name": "new_token"}],
                        "release": ["new_token"],
                    },
                    "decode": {"walk": "", "inputs": [], "release": []},
                },
                "python_transitions": False,
            }
        ],
        "connections": [],
        "client_outputs": [{"name": "new_token", "modality": "text"}],
    }
    round_trips(graph)


def test_llm_default_hooks_apply_the_declarative_transitions():
    model = LLMGraphModel(128)
    assert not model.python_transitions
    prompt_ids = object()  # the hooks only route values; any value stands for one
    first = model.get_initial_forward_pass_args("default", ["text"], ["text"], {"text_inputs": [prompt_ids]})
    assert first == ForwardPassArgs("prefill", inputs={("llm", "text_inputs"): [prompt_ids]})

    token = object()
    after_prefill = model.get_partition_forward_pass_args(
        "default", ConductorMetadata("prefill"), {"new_token": [token]}
    )
    assert after_prefill.graph_walk == "decode"
    assert after_prefill.inputs == {("llm", "text_inputs"): [token]}
    assert after_prefill.unpersist_tensors == [token]
    assert not after_prefill.request_done

    after_decode = model.get_partition_forward_pass_args("default", ConductorMetadata("decode"), {})
    assert after_decode.request_done and after_decode.graph_walk == ""


# ---- Orpheus-like TTS: two partitions joined by a sliding window ---------------------


class OrpheusLike(GraphModel):
    def get_node_engine_types(self):
        return {"llm": EngineType.KV_CACHE, "codec": EngineType.STATELESS}

    def get_graph_walk_graphs(self):
        return {
            "prefill": GraphNode(
                "llm",
                ["text_inputs"],
                [
                    GraphEdge(EMPTY_DESTINATION, "new_token", persist=True, conductor_new_token=True),
                    StreamingGraphEdge("codec", "new_token", "codec"),
                ],
            ),
            "decode": Loop(
                GraphNode(
                    "llm",
                    ["text_inputs"],
                    [GraphEdge("llm", "text_inputs"), StreamingGraphEdge("codec", "new_token", target_partition="codec")],
                ),
                max_iters=2048,
                outputs=[],
                name="decode_loop",
            ),
            "codec_chunk": GraphNode(
                "codec", ["new_token"], [GraphEdge(EMIT_TO_CLIENT, "audio_chunk", output_modality="audio")]
            ),
        }

    def get_partition_topology(self):
        return PartitionTopology(
            ["llm", "codec"],
            [Connection("llm", "codec", "new_token", lambda: SlidingWindowChunkPolicy(window=28, stride=7))],
        )

    def get_partitions(self):
        return {"llm": {"prefill", "decode"}, "codec": {"codec_chunk"}}

    def get_walk_transitions(self):
        return {
            "llm": LLMGraphModel(1).get_walk_transitions()["default"],
            "codec": PartitionTransitions(WalkStep("codec_chunk"), {"codec_chunk": WalkStep("codec_chunk")}),
        }


def test_orpheus_like_tts_exports_partitions_streaming_edges_and_policy():
    graph = export_graph(OrpheusLike())
    stream = edge("codec", "new_token", target="codec")
    assert graph == {
        "version": 1,
        "nodes": [
            {"name": "llm", "engine": "kv_cache", "overlap": True, "stop_token_ids": [], "kv_inputs": ["embeds", "positions"], "frame_width": 0},
            {"name": "codec", "engine": "stateless", "overlap": True, "stop_token_ids": [], "kv_inputs": [], "frame_width": 0},
        ],
        "sections": [
            node_row("llm", ["text_inputs"], [edge("", "new_token", persist=True, new_token=True), stream]),
            loop_row(2, "decode_loop", 2048),
            node_row("llm", ["text_inputs"], [edge("llm", "text_inputs"), stream]),
            node_row("codec", ["new_token"], [edge("emit_to_client", "audio_chunk", modality="audio")]),
        ],
        "walks": [
            {"name": "prefill", "partition": "llm", "root": 0},
            {"name": "decode", "partition": "llm", "root": 1},
            {"name": "codec_chunk", "partition": "codec", "root": 3},
        ],
        "partitions": [
            {
                "name": "llm",
                "walks": ["prefill", "decode"],
                "start": walk_step("prefill", [("llm", "text_inputs", "prompt", "text_inputs")]),
                "after": {
                    "prefill": walk_step("decode", [("llm", "text_inputs", "persist", "new_token")], ["new_token"]),
                    "decode": walk_step(""),
                },
                "python_transitions": False,
            },
            {
                "name": "codec",
                "walks": ["codec_chunk"],
                "start": walk_step("codec_chunk"),
                "after": {"codec_chunk": walk_step("codec_chunk")},
                "python_transitions": False,
            },
        ],
        "connections": [
            {
                "from_partition": "llm",
                "to_partition": "codec",
                "edge_name": "new_token",
                "policy": {"kind": "sliding_window", "size": 28, "stride": 7, "left": 0, "continue_after_done": False},
            }
        ],
        "client_outputs": [{"name": "audio_chunk", "modality": "audio"}],
    }
    round_trips(graph)


def test_stop_token_ids_are_exported_per_node_and_checked():
    class WithStops(OrpheusLike):
        stops = {"llm": [128258, 7]}

        def get_stop_token_ids(self, node_name):
            return self.stops.get(node_name, [])

    graph = export_graph(WithStops())
    assert [(n["name"], n["stop_token_ids"]) for n in graph["nodes"]] == [("llm", [128258, 7]), ("codec", [])]
    for bad, message in [((5,), None), ([-1], "-1 is not a token id"), ([True], "True is not a token id"), ("7", "list of int")]:
        model = WithStops()
        model.stops = {"llm": bad}
        if message is None:  # a tuple is fine and exports as a list
            assert export_graph(model)["nodes"][0]["stop_token_ids"] == [5]
            continue
        with pytest.raises(GraphDeclarationError, match=rf"get_stop_token_ids\('llm'\).*{message}"):
            export_graph(model)


def test_export_is_deterministic_and_calls_each_policy_factory_once():
    calls = []

    class Counting(OrpheusLike):
        def get_partition_topology(self):
            def factory():
                calls.append(1)
                return LeftContextChunkPolicy(25, 25)

            return PartitionTopology(["llm", "codec"], [Connection("llm", "codec", "new_token", factory)])

    first = export_graph(Counting())
    assert len(calls) == 1
    assert first["connections"][0]["policy"] == {
        "kind": "left_context", "size": 25, "stride": 0, "left": 25, "continue_after_done": False,
    }
    assert msgpack.packb(export_graph(Counting())) == msgpack.packb(first)
    assert json.dumps(export_graph(Counting())) == json.dumps(first)


def test_fixed_policy_exports_continue_after_done():
    class Fixed(OrpheusLike):
        def get_partition_topology(self):
            return PartitionTopology(
                ["llm", "codec"], [Connection("llm", "codec", "new_token", lambda: FixedChunkPolicy(1, continue_after_done=True))]
            )

    assert export_graph(Fixed())["connections"][0]["policy"] == {
        "kind": "fixed", "size": 1, "stride": 0, "left": 0, "continue_after_done": True,
    }


# ---- BAGEL-like CFG denoising: Parallel inside a Loop, then a decoder --------------------


BRANCHES = ("LLM", "LLM_cfg_text", "LLM_cfg_img")


class BagelLike(GraphModel):
    def get_node_engine_types(self):
        return {
            **{b: EngineType.KV_CACHE for b in BRANCHES},
            "combine_cfg": EngineType.STATELESS,
            "vae_decoder": "stateless",  # the plain string is accepted too
        }

    def get_graph_walk_graphs(self):
        branches = Parallel(
            [GraphNode(b, ["latents", "time_index"], [GraphEdge("combine_cfg", f"v_{b}")]) for b in BRANCHES]
        )
        feedback = [GraphEdge(dest, name) for dest in (*BRANCHES, "combine_cfg") for name in ("latents", "time_index")]
        combine = GraphNode(
            "combine_cfg",
            [f"v_{b}" for b in BRANCHES] + ["latents", "time_index"],
            feedback,
            enable_async_scheduling=False,
        )
        denoise = Loop(
            Sequential([branches, combine]),
            max_iters=49,
            outputs=[GraphEdge("vae_decoder", "latents")],
            name="denoise",
        )
        decoder = GraphNode("vae_decoder", {"latents"}, [GraphEdge(EMIT_TO_CLIENT, "image", output_modality="image")])
        return {"image_gen": Sequential([denoise, decoder])}

    def get_walk_transitions(self):
        return {
            "default": PartitionTransitions(
                WalkStep(
                    "image_gen",
                    [WalkInput(n, i, "prompt", i) for n in (*BRANCHES, "combine_cfg") for i in ("latents", "time_index")],
                ),
                {"image_gen": WalkStep("")},
            )
        }


def test_bagel_like_cfg_loop_with_parallel_branches_exports_flat_sections():
    graph = export_graph(BagelLike())
    feedback = [edge(d, n) for d in (*BRANCHES, "combine_cfg") for n in ("latents", "time_index")]
    assert graph["nodes"] == [
        {"name": "LLM", "engine": "kv_cache", "overlap": True, "stop_token_ids": [], "kv_inputs": ["embeds", "positions"], "frame_width": 0},
        {"name": "LLM_cfg_text", "engine": "kv_cache", "overlap": True, "stop_token_ids": [], "kv_inputs": ["embeds", "positions"], "frame_width": 0},
        {"name": "LLM_cfg_img", "engine": "kv_cache", "overlap": True, "stop_token_ids": [], "kv_inputs": ["embeds", "positions"], "frame_width": 0},
        {"name": "combine_cfg", "engine": "stateless", "overlap": False, "stop_token_ids": [], "kv_inputs": [], "frame_width": 0},
        {"name": "vae_decoder", "engine": "stateless", "overlap": True, "stop_token_ids": [], "kv_inputs": [], "frame_width": 0},
    ]
    assert graph["sections"] == [
        group_row("sequential", [1, 8]),
        loop_row(2, "denoise", 49, outputs=[edge("vae_decoder", "latents")]),
        group_row("sequential", [3, 7]),
        group_row("parallel", [4, 5, 6]),
        node_row("LLM", ["latents", "time_index"], [edge("combine_cfg", "v_LLM")]),
        node_row("LLM_cfg_text", ["latents", "time_index"], [edge("combine_cfg", "v_LLM_cfg_text")]),
        node_row("LLM_cfg_img", ["latents", "time_index"], [edge("combine_cfg", "v_LLM_cfg_img")]),
        node_row("combine_cfg", ["v_LLM", "v_LLM_cfg_text", "v_LLM_cfg_img", "latents", "time_index"], feedback),
        node_row("vae_decoder", ["latents"], [edge("emit_to_client", "image", modality="image")]),
    ]
    assert graph["walks"] == [{"name": "image_gen", "partition": "default", "root": 0}]
    assert graph["partitions"][0]["start"]["inputs"][0] == {
        "node": "LLM", "name": "latents", "source": "prompt", "source_name": "latents",
    }
    assert graph["client_outputs"] == [{"name": "image", "modality": "image"}]
    round_trips(graph)


# ---- V-JEPA-like rollout: accumulated outputs, default transitions ----------------------


class VJepaLike(GraphModel):
    def get_node_engine_types(self):
        return {"encoder": EngineType.STATELESS, "predictor": EngineType.STATELESS}

    def get_graph_walk_graphs(self):
        encoder = GraphNode("encoder", ["frames"], [GraphEdge("predictor", "context"), GraphEdge("predictor", "state")])
        rollout = Loop(
            GraphNode("predictor", ["context", "state"], [GraphEdge("predictor", "state")], enable_async_scheduling=False),
            max_iters=4,
            name="rollout",
            accumulated_outputs=[GraphEdge(EMIT_TO_CLIENT, "state", persist=True, output_modality="embedding")],
        )
        return {"rollout": Sequential([encoder, rollout])}


def test_vjepa_like_rollout_exports_accumulated_outputs_and_default_transitions():
    graph = export_graph(VJepaLike())
    assert graph == {
        "version": 1,
        "nodes": [
            {"name": "encoder", "engine": "stateless", "overlap": True, "stop_token_ids": [], "kv_inputs": [], "frame_width": 0},
            {"name": "predictor", "engine": "stateless", "overlap": False, "stop_token_ids": [], "kv_inputs": [], "frame_width": 0},
        ],
        "sections": [
            group_row("sequential", [1, 2]),
            node_row("encoder", ["frames"], [edge("predictor", "context"), edge("predictor", "state")]),
            loop_row(3, "rollout", 4, accumulated=[edge("emit_to_client", "state", persist=True, modality="embedding")]),
            node_row("predictor", ["context", "state"], [edge("predictor", "state")]),
        ],
        "walks": [{"name": "rollout", "partition": "default", "root": 0}],
        "partitions": [
            {
                "name": "default",
                "walks": ["rollout"],
                # Default transitions: run the one walk once, its unfed inputs from the prompt.
                "start": walk_step("rollout", [("encoder", "frames", "prompt", "frames")]),
                "after": {"rollout": walk_step("")},
                "python_transitions": False,
            }
        ],
        "connections": [],
        "client_outputs": [{"name": "state", "modality": "embedding"}],
    }
    round_trips(graph)


# ---- nested loops, the inner loop last in the outer body --------------------------------


class NestedLoops(GraphModel):
    def get_node_engine_types(self):
        return {"head": EngineType.STATELESS, "inner": EngineType.STATELESS, "decoder": EngineType.STATELESS}

    def get_graph_walk_graphs(self):
        inner = Loop(GraphNode("inner", ["x"], [GraphEdge("inner", "x"), GraphEdge("head", "x")]), 3, name="inner_loop",
                     outputs=[GraphEdge("head", "x")])
        outer = Loop(
            Sequential([GraphNode("head", ["x"], [GraphEdge("inner", "x")]), inner]),
            2,
            outputs=[GraphEdge("decoder", "x")],
            name="outer_loop",
        )
        tail = GraphNode("decoder", ["x"], [GraphEdge(EMIT_TO_CLIENT, "out", output_modality="embedding")])
        return {"run": Sequential([outer, tail])}


def test_nested_loops_export_children_by_index_parents_first():
    graph = export_graph(NestedLoops())
    assert graph["sections"] == [
        group_row("sequential", [1, 6]),
        loop_row(2, "outer_loop", 2, outputs=[edge("decoder", "x")]),
        group_row("sequential", [3, 4]),
        node_row("head", ["x"], [edge("inner", "x")]),
        loop_row(5, "inner_loop", 3, outputs=[edge("head", "x")]),
        node_row("inner", ["x"], [edge("inner", "x"), edge("head", "x")]),
        node_row("decoder", ["x"], [edge("emit_to_client", "out", modality="embedding")]),
    ]
    # Every input of the walk is fed by some edge, so the default start has no prompt inputs.
    assert graph["partitions"][0]["start"] == walk_step("run")
    round_trips(graph)


# ---- python transitions ------------------------------------------------------------------


def test_a_model_overriding_the_hooks_is_exported_as_python_transitions():
    class StateMachine(OrpheusLike):
        def get_walk_transitions(self):
            raise AssertionError("not consulted for a python-transitions model")

        def get_partition_forward_pass_args(self, partition_name, partition_metadata, persist_signals, incoming_connections=None):
            return ForwardPassArgs("", request_done=True)

    assert StateMachine().python_transitions

    class HooksOnly(StateMachine):
        get_walk_transitions = GraphModel.get_walk_transitions

    graph = export_graph(HooksOnly())
    assert [p["python_transitions"] for p in graph["partitions"]] == [True, True]
    assert [(p["start"], p["after"]) for p in graph["partitions"]] == [(None, {}), (None, {})]


def test_an_inactive_partition_exports_start_null():
    class TextOnly(OrpheusLike):
        def get_walk_transitions(self):
            return {**super().get_walk_transitions(), "codec": PartitionTransitions(None)}

    codec = export_graph(TextOnly())["partitions"][1]
    assert codec["start"] is None and codec["after"] == {}


# ---- declaration errors (types and shapes only) -----------------------------------------


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: GraphNode(3, ["x"], []), "GraphNode.name must be a str"),
        (lambda: GraphNode("n", "x", []), "input_names must be a list or set"),
        (lambda: GraphNode("n", ["x", "x"], []), "duplicate"),
        (lambda: GraphNode("n", ["x"], [("a", "b")]), "outputs[0] must be a GraphEdge"),
        (lambda: GraphEdge("n", ""), "GraphEdge.name must not be empty"),
        (lambda: GraphEdge("n", "x", persist=1), "persist must be a bool"),
        (lambda: GraphEdge(EMIT_TO_CLIENT, "x"), "needs an output_modality"),
        (lambda: StreamingGraphEdge("n", "x", ""), "target_partition must not be empty"),
        (lambda: Sequential([]), "must not be empty"),
        (lambda: Parallel([GraphNode("n", [], []), "m"]), "sections[1] must be a GraphNode"),
        (lambda: Loop(GraphNode("n", [], []), "3"), "max_iters must be an int"),
        (lambda: Loop(GraphNode("n", [], []), True), "max_iters must be an int"),
        (lambda: Loop([GraphNode("n", [], [])], 3), "section must be a GraphNode"),
        (lambda: SlidingWindowChunkPolicy(28, 0), "stride must be >= 1"),
        (lambda: FixedChunkPolicy(2.5), "chunk_size must be an int"),
        (lambda: LeftContextChunkPolicy(25, -1), "left_context must be >= 0"),
        (lambda: Connection("a", "b", "x", SlidingWindowChunkPolicy(2, 1)), "must be callable"),
        (lambda: PartitionTopology(["a", "a"]), "duplicate"),
        (lambda: WalkInput("llm", "text_inputs", "cache", "x"), "source must be 'prompt' or 'persist'"),
        (lambda: WalkStep("decode", release="new_token"), "release must be a list"),
    ],
)
def test_wrong_types_and_shapes_are_refused_where_declared(build, message):
    with pytest.raises(GraphDeclarationError) as err:
        build()
    assert message in str(err.value)


def test_export_refuses_unknown_nodes_engines_partitions_and_policies():
    class UnknownNode(VJepaLike):
        def get_node_engine_types(self):
            return {"encoder": EngineType.STATELESS}

    with pytest.raises(GraphDeclarationError, match="node 'predictor' is not in get_node_engine_types"):
        export_graph(UnknownNode())

    class BadEngine(VJepaLike):
        def get_node_engine_types(self):
            return {"encoder": "gpu", "predictor": "stateless"}

    with pytest.raises(GraphDeclarationError, match="unknown engine type 'gpu'"):
        export_graph(BadEngine())

    class StrayPartition(OrpheusLike):
        def get_partitions(self):
            return {**super().get_partitions(), "vocoder": {"codec_chunk"}}

    with pytest.raises(GraphDeclarationError, match="partition 'vocoder'"):
        export_graph(StrayPartition())

    class MissingTransitions(OrpheusLike):
        def get_walk_transitions(self):
            return {"llm": super().get_walk_transitions()["llm"]}

    with pytest.raises(GraphDeclarationError, match="no entry for partition 'codec'"):
        export_graph(MissingTransitions())

    class CustomPolicy(OrpheusLike):
        def get_partition_topology(self):
            return PartitionTopology(["llm", "codec"], [Connection("llm", "codec", "new_token", lambda: object())])

    with pytest.raises(GraphDeclarationError, match="chunk policy object is not one of"):
        export_graph(CustomPolicy())

    class TwoPartitionsNoDeclaration(VJepaLike):
        def get_partition_topology(self):
            return PartitionTopology(["a", "b"])

    with pytest.raises(GraphDeclarationError, match="declare get_partitions"):
        export_graph(TwoPartitionsNoDeclaration())


def test_semantic_problems_are_left_to_the_typescript_compiler():
    # max_iters 0 and an edge to a node no walk has are exported as written:
    # src/graph/compile.ts refuses them with one line, so there is one rule each.
    class Lenient(GraphModel):
        def get_node_engine_types(self):
            return {"n": EngineType.STATELESS}

        def get_graph_walk_graphs(self):
            return {"w": Loop(GraphNode("n", ["x"], [GraphEdge("nowhere", "y")]), 0, name="l")}

    graph = export_graph(Lenient())
    assert graph["sections"][0]["max_iters"] == 0
    assert graph["sections"][1]["outputs"] == [edge("nowhere", "y")]


def test_graph_objects_are_immutable_and_equal_by_value():
    node = GraphNode("n", ["x"], [GraphEdge("m", "y")])
    with pytest.raises(AttributeError):
        node.name = "other"  # type: ignore[misc]
    assert node == GraphNode("n", ["x"], [GraphEdge("m", "y")])
    assert hash(node) == hash(GraphNode("n", ["x"], [GraphEdge("m", "y")]))
    streaming = StreamingGraphEdge("m", "y", "p")
    assert streaming.is_streaming and streaming.target_partition == "p"
    assert streaming != GraphEdge("m", "y")
    # Sets of input names export sorted, lists in the author's order.
    assert GraphNode("n", {"b", "a"}, []).input_names == ("a", "b")
    assert GraphNode("n", ["b", "a"], []).input_names == ("b", "a")


def test_default_transitions_run_a_producer_once_and_a_stream_consumer_per_chunk():
    class EncodeDecode(GraphModel):
        def get_node_engine_types(self):
            return {"enc": EngineType.STATELESS, "dec": EngineType.STATELESS}

        def get_graph_walk_graphs(self):
            return {
                "encode": GraphNode("enc", ["pixels"], [StreamingGraphEdge("dec", "frames", "decoder")]),
                "decode": GraphNode("dec", ["frames"], [GraphEdge(EMIT_TO_CLIENT, "video", output_modality="video")]),
            }

        def get_partition_topology(self):
            return PartitionTopology(
                ["encoder", "decoder"], [Connection("encoder", "decoder", "frames", lambda: FixedChunkPolicy(4))]
            )

        def get_partitions(self):
            return {"encoder": {"encode"}, "decoder": {"decode"}}

    encoder, decoder = export_graph(EncodeDecode())["partitions"]
    assert (encoder["start"], encoder["after"]) == (
        walk_step("encode", [("enc", "pixels", "prompt", "pixels")]),
        {"encode": walk_step("")},
    )
    assert (decoder["start"], decoder["after"]) == (walk_step("decode"), {"decode": walk_step("decode")})
