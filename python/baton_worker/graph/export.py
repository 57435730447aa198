"""A model's graph as data: the flat layout the TypeScript compiler reads.

Sections are a table referring to their children by index (no recursion on the
wire); every list follows the model's declaration order, so the same model
always exports the same bytes. Only plain dicts, lists, str, int and bool come
out: msgpack- and JSON-serialisable as they are.

Python checks types and shapes here (what cannot be represented in the
layout); the semantic rules are the TypeScript compiler's (src/graph/compile.ts).
"""

from __future__ import annotations

from typing import Any

from .authoring import (
    EMIT_TO_CLIENT,
    EngineType,
    GraphDeclarationError,
    GraphEdge,
    GraphNode,
    GraphSection,
    Loop,
    Parallel,
    Sequential,
    iter_sections,
)
from .model import KV_INPUT_ROLES, GraphModel, PartitionTransitions, WalkStep
from .streaming import FixedChunkPolicy, LeftContextChunkPolicy, PartitionTopology, SlidingWindowChunkPolicy

GRAPH_LAYOUT_VERSION = 1

__all__ = ["GRAPH_LAYOUT_VERSION", "GraphDeclarationError", "export_graph"]


def export_graph(model: GraphModel) -> dict[str, Any]:
    engines = _engine_types(model)
    graphs = model.get_graph_walk_graphs()
    if not isinstance(graphs, dict) or not graphs:
        raise GraphDeclarationError("get_graph_walk_graphs() must return a non-empty dict of walk -> section")

    sections: list[dict[str, Any]] = []
    roots: dict[str, int] = {}
    for walk, root in graphs.items():
        if not isinstance(walk, str) or not walk:
            raise GraphDeclarationError(f"walk name {walk!r} must be a non-empty str")
        if not isinstance(root, (GraphNode, Sequential, Parallel, Loop)):
            raise GraphDeclarationError(
                f"walk {walk!r}: graph must be a GraphNode, Sequential, Parallel or Loop, got {type(root).__name__}"
            )
        for sec in iter_sections(root):
            if isinstance(sec, GraphNode) and sec.name not in engines:
                raise GraphDeclarationError(
                    f"walk {walk!r}: node {sec.name!r} is not in get_node_engine_types()"
                )
        roots[walk] = _add_section(sections, root)

    topology = model.get_partition_topology()
    if not isinstance(topology, PartitionTopology):
        raise GraphDeclarationError("get_partition_topology() must return a PartitionTopology")
    partition_walks = _partition_walks(model, topology, graphs)
    transitions = _transitions(model, topology)
    python_transitions = model.python_transitions

    walk_partition: dict[str, str] = {}
    for partition in topology.partitions:
        for walk in partition_walks[partition]:
            walk_partition.setdefault(walk, partition)  # a walk in two partitions is the compiler's to refuse

    return {
        "version": GRAPH_LAYOUT_VERSION,
        "nodes": [
            {
                "name": name,
                "engine": engine.value,
                "overlap": _overlap(name, graphs),
                "stop_token_ids": _stop_token_ids(model, name),
                "kv_inputs": _kv_input_roles(model, name) if engine is EngineType.KV_CACHE else [],
                "frame_width": model.get_frame_width(name) if engine is EngineType.KV_CACHE else 0,
            }
            for name, engine in engines.items()
        ],
        "sections": sections,
        "walks": [
            {"name": walk, "partition": walk_partition.get(walk, ""), "root": roots[walk]} for walk in graphs
        ],
        "partitions": [
            _partition(name, partition_walks[name], transitions.get(name), python_transitions)
            for name in topology.partitions
        ],
        "connections": [
            {
                "from_partition": c.from_partition,
                "to_partition": c.to_partition,
                "edge_name": c.edge_name,
                "policy": _policy(c.chunk_policy()),
            }
            for c in topology.connections
        ],
        "client_outputs": _client_outputs(sections),
    }


def _engine_types(model: GraphModel) -> dict[str, EngineType]:
    declared = model.get_node_engine_types()
    if not isinstance(declared, dict) or not declared:
        raise GraphDeclarationError("get_node_engine_types() must return a non-empty dict of node -> EngineType")
    engines: dict[str, EngineType] = {}
    for name, engine in declared.items():
        if not isinstance(name, str) or not name:
            raise GraphDeclarationError(f"node name {name!r} must be a non-empty str")
        try:
            engines[name] = EngineType(engine)
        except ValueError:
            raise GraphDeclarationError(
                f"node {name!r}: unknown engine type {engine!r} (kv_cache or stateless)"
            ) from None
    return engines


def _kv_input_roles(model: GraphModel, node: str) -> list[str]:
    roles = model.get_kv_input_roles(node)
    if not isinstance(roles, list) or any(r not in KV_INPUT_ROLES for r in roles) or len(set(roles)) != len(roles):
        raise GraphDeclarationError(f"get_kv_input_roles({node!r}) must return distinct roles of {', '.join(KV_INPUT_ROLES)}; got {roles!r}")
    return roles


def _stop_token_ids(model: GraphModel, node: str) -> list[int]:
    ids = model.get_stop_token_ids(node)
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
        raise GraphDeclarationError(f"get_stop_token_ids({node!r}) must return a list of int")
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise GraphDeclarationError(f"get_stop_token_ids({node!r}): {token!r} is not a token id (int >= 0)")
    return list(ids)


def _edge(edge: GraphEdge) -> dict[str, Any]:
    return {
        "to": edge.next_node,
        "name": edge.name,
        "persist": edge.persist,
        "new_token": edge.conductor_new_token,
        "modality": edge.output_modality,
        "target_partition": edge.target_partition,
    }


def _add_section(table: list[dict[str, Any]], section: GraphSection) -> int:
    """Append `section` and (after it) its subtree; return its index."""
    index = len(table)
    row: dict[str, Any] = {
        "kind": "",
        "node": "",
        "inputs": [],
        "outputs": [],
        "accumulated_outputs": [],
        "children": [],
        "loop_name": "",
        "max_iters": 0,
    }
    table.append(row)
    if isinstance(section, GraphNode):
        row.update(
            kind="node",
            node=section.name,
            inputs=list(section.input_names),
            outputs=[_edge(e) for e in section.outputs],
        )
    elif isinstance(section, Loop):
        row.update(
            kind="loop",
            outputs=[_edge(e) for e in section.outputs],
            accumulated_outputs=[_edge(e) for e in section.accumulated_outputs],
            loop_name=section.name,
            max_iters=section.max_iters,
        )
        row["children"] = [_add_section(table, section.section)]
    else:
        row["kind"] = "sequential" if isinstance(section, Sequential) else "parallel"
        row["children"] = [_add_section(table, member) for member in section.sections]
    return index


def _overlap(node: str, graphs: dict[str, GraphSection]) -> bool:
    # One opt-out anywhere opts the node out: overlap is a property of its submodule.
    return all(
        sec.enable_async_scheduling
        for root in graphs.values()
        for sec in iter_sections(root)
        if isinstance(sec, GraphNode) and sec.name == node
    )


def _partition_walks(
    model: GraphModel, topology: PartitionTopology, graphs: dict[str, GraphSection]
) -> dict[str, list[str]]:
    declared = model.get_partitions()
    if not isinstance(declared, dict):
        raise GraphDeclarationError("get_partitions() must return a dict of partition -> set of walks")
    for name, walks in declared.items():
        if name not in topology.partitions:
            raise GraphDeclarationError(
                f"get_partitions() names partition {name!r}, which get_partition_topology() does not list"
            )
        if isinstance(walks, (str, bytes)) or not all(isinstance(w, str) for w in walks):
            raise GraphDeclarationError(f"get_partitions()[{name!r}] must be a set of walk names")
    result: dict[str, list[str]] = {}
    for name in topology.partitions:
        walks = set(declared.get(name, ()))
        # Declaration order of the walks; names no graph declares go last, sorted,
        # for the compiler to refuse.
        result[name] = [w for w in graphs if w in walks] + sorted(walks - set(graphs))
    return result


def _transitions(model: GraphModel, topology: PartitionTopology) -> dict[str, PartitionTransitions]:
    if model.python_transitions and type(model).get_walk_transitions is GraphModel.get_walk_transitions:
        return {}  # the hooks decide; nothing declarative to export
    declared = model.get_walk_transitions()
    if not isinstance(declared, dict):
        raise GraphDeclarationError("get_walk_transitions() must return a dict of partition -> PartitionTransitions")
    for name, value in declared.items():
        if name not in topology.partitions:
            raise GraphDeclarationError(f"get_walk_transitions() names unknown partition {name!r}")
        if not isinstance(value, PartitionTransitions):
            raise GraphDeclarationError(f"get_walk_transitions()[{name!r}] must be a PartitionTransitions")
    for name in topology.partitions:
        if name not in declared:
            raise GraphDeclarationError(
                f"get_walk_transitions() has no entry for partition {name!r} "
                "(PartitionTransitions(None) makes it inactive)"
            )
    return declared


def _walk_step(step: WalkStep) -> dict[str, Any]:
    return {
        "walk": step.walk,
        "inputs": [
            {"node": i.node, "name": i.name, "source": i.source, "source_name": i.source_name}
            for i in step.inputs
        ],
        "release": list(step.release),
    }


def _partition(
    name: str, walks: list[str], transitions: PartitionTransitions | None, python_transitions: bool
) -> dict[str, Any]:
    return {
        "name": name,
        "walks": walks,
        "start": _walk_step(transitions.start) if transitions and transitions.start else None,
        "after": {walk: _walk_step(step) for walk, step in (transitions.after if transitions else {}).items()},
        "python_transitions": python_transitions,
    }


def _policy(policy: object) -> dict[str, Any]:
    row = {"kind": "", "size": 0, "stride": 0, "left": 0, "continue_after_done": False}
    if isinstance(policy, FixedChunkPolicy):
        row.update(kind="fixed", size=policy.chunk_size, continue_after_done=policy.continue_after_done)
    elif isinstance(policy, SlidingWindowChunkPolicy):
        row.update(kind="sliding_window", size=policy.window, stride=policy.stride)
    elif isinstance(policy, LeftContextChunkPolicy):
        row.update(kind="left_context", size=policy.chunk, left=policy.left_context)
    else:  # Connection.chunk_policy() already refused anything else
        raise GraphDeclarationError(f"unsupported chunk policy {type(policy).__name__}")
    return row


def _client_outputs(sections: list[dict[str, Any]]) -> list[dict[str, str]]:
    seen: list[dict[str, str]] = []
    for row in sections:
        for edge in (*row["outputs"], *row["accumulated_outputs"]):
            if edge["to"] == EMIT_TO_CLIENT:
                entry = {"name": edge["name"], "modality": edge["modality"]}
                if entry not in seen:
                    seen.append(entry)
    return seen
