"""Graph primitives a model author declares with (M*'s names and constructors).

Everything here is an immutable description: no per-request state lives in a
graph object, so one declaration serves every request (the TypeScript conductor
keeps walk state in its own dense arrays). Constructors check types and shapes
only; the semantic rules (max_iters >= 1, edges naming inputs their destination
takes, loop outputs the body produces, ...) are checked once, by the TypeScript
compiler, when the worker's exported graph reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Union

EMIT_TO_CLIENT = "emit_to_client"
# An edge routed nowhere; with persist=True its value goes to the conductor only.
EMPTY_DESTINATION = ""


class GraphDeclarationError(Exception):
    """A model's graph declaration has a wrong type or shape (found in Python)."""


class EngineType(str, Enum):
    KV_CACHE = "kv_cache"
    STATELESS = "stateless"


def _require_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise GraphDeclarationError(f"{what} must be a str, got {type(value).__name__}")
    return value


def _require_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise GraphDeclarationError(f"{what} must be a bool, got {type(value).__name__}")
    return value


def _require_nonempty_str(value: object, what: str) -> str:
    if not _require_str(value, what):
        raise GraphDeclarationError(f"{what} must not be empty")
    return value


def _edge_tuple(edges: Iterable[object], what: str) -> tuple["GraphEdge", ...]:
    if isinstance(edges, (str, bytes, GraphEdge)) or not isinstance(edges, Iterable):
        raise GraphDeclarationError(f"{what} must be a list of GraphEdge")
    out = tuple(edges)
    for i, edge in enumerate(out):
        if not isinstance(edge, GraphEdge):
            raise GraphDeclarationError(
                f"{what}[{i}] must be a GraphEdge, got {type(edge).__name__}"
            )
    return out


@dataclass(frozen=True, init=False)
class GraphEdge:
    """A named value leaving a node (or a loop) for `next_node`.

    `name` is both the producer's output name and the consumer's input name.
    Flags as M* has them: `persist` hands the value to the conductor so a later
    walk can use it, `conductor_new_token` counts it as generated tokens, and an
    edge to EMIT_TO_CLIENT carries `output_modality` (text, audio, image, ...).
    """

    next_node: str
    name: str
    persist: bool
    conductor_new_token: bool
    output_modality: str

    def __init__(
        self,
        next_node: str,
        name: str,
        persist: bool = False,
        conductor_new_token: bool = False,
        output_modality: str = "",
    ) -> None:
        _set_edge_fields(self, next_node, name, persist, conductor_new_token, output_modality)

    @property
    def is_streaming(self) -> bool:
        return False

    @property
    def target_partition(self) -> str:
        return ""


def _set_edge_fields(
    edge: GraphEdge,
    next_node: object,
    name: object,
    persist: object,
    conductor_new_token: object,
    output_modality: object,
) -> None:
    set_ = object.__setattr__  # frozen dataclass: fields are set once, here
    set_(edge, "next_node", _require_str(next_node, "GraphEdge.next_node"))
    set_(edge, "name", _require_nonempty_str(name, "GraphEdge.name"))
    set_(edge, "persist", _require_bool(persist, f"GraphEdge {name!r}: persist"))
    set_(
        edge,
        "conductor_new_token",
        _require_bool(conductor_new_token, f"GraphEdge {name!r}: conductor_new_token"),
    )
    modality = _require_str(output_modality, f"GraphEdge {name!r}: output_modality")
    if next_node == EMIT_TO_CLIENT and not modality:
        raise GraphDeclarationError(
            f"GraphEdge {name!r} to EMIT_TO_CLIENT needs an output_modality"
        )
    set_(edge, "output_modality", modality)


@dataclass(frozen=True, init=False)
class StreamingGraphEdge(GraphEdge):
    """An edge whose values stream into another partition's chunk buffer."""

    _target_partition: str

    def __init__(
        self,
        next_node: str,
        name: str,
        target_partition: str,
        persist: bool = False,
        conductor_new_token: bool = False,
        output_modality: str = "",
    ) -> None:
        _set_edge_fields(self, next_node, name, persist, conductor_new_token, output_modality)
        object.__setattr__(
            self,
            "_target_partition",
            _require_nonempty_str(target_partition, f"StreamingGraphEdge {name!r}: target_partition"),
        )

    @property
    def is_streaming(self) -> bool:
        return True

    @property
    def target_partition(self) -> str:
        return self._target_partition

    def __repr__(self) -> str:
        return (
            f"StreamingGraphEdge(next_node={self.next_node!r}, name={self.name!r}, "
            f"target_partition={self.target_partition!r}, persist={self.persist}, "
            f"conductor_new_token={self.conductor_new_token}, "
            f"output_modality={self.output_modality!r})"
        )


@dataclass(frozen=True, init=False)
class GraphNode:
    """One run of submodule `name` once every input in `input_names` arrived.

    `input_names` keeps the author's order (a set is sorted, for a stable
    export). `enable_async_scheduling=False` opts the node out of overlap: no
    step of it is scheduled before the previous one's stop checks are known.
    """

    name: str
    input_names: tuple[str, ...]
    outputs: tuple[GraphEdge, ...]
    enable_async_scheduling: bool

    def __init__(
        self,
        name: str,
        input_names: Iterable[str],
        outputs: Iterable[GraphEdge],
        enable_async_scheduling: bool = True,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "name", _require_nonempty_str(name, "GraphNode.name"))
        if isinstance(input_names, (str, bytes)) or not isinstance(input_names, Iterable):
            raise GraphDeclarationError(f"GraphNode {name!r}: input_names must be a list or set of str")
        names = sorted(input_names) if isinstance(input_names, (set, frozenset)) else list(input_names)
        for i, input_name in enumerate(names):
            _require_nonempty_str(input_name, f"GraphNode {name!r}: input_names[{i}]")
        if len(set(names)) != len(names):
            raise GraphDeclarationError(f"GraphNode {name!r}: input_names has a duplicate")
        set_(self, "input_names", tuple(names))
        set_(self, "outputs", _edge_tuple(outputs, f"GraphNode {name!r}: outputs"))
        set_(
            self,
            "enable_async_scheduling",
            _require_bool(enable_async_scheduling, f"GraphNode {name!r}: enable_async_scheduling"),
        )


def _section_tuple(sections: Iterable[object], what: str) -> tuple["GraphSection", ...]:
    if isinstance(sections, (str, bytes)) or not isinstance(sections, Iterable):
        raise GraphDeclarationError(f"{what}: sections must be a list of graph sections")
    out = tuple(sections)
    if not out:
        raise GraphDeclarationError(f"{what}: sections must not be empty")
    for i, section in enumerate(out):
        if not isinstance(section, _SECTION_TYPES):
            raise GraphDeclarationError(
                f"{what}: sections[{i}] must be a GraphNode, Sequential, Parallel or Loop, "
                f"got {type(section).__name__}"
            )
    return out


@dataclass(frozen=True, init=False)
class Sequential:
    """Members run one after the other (each when its inputs arrive)."""

    sections: tuple["GraphSection", ...]

    def __init__(self, sections: Iterable["GraphSection"]) -> None:
        object.__setattr__(self, "sections", _section_tuple(sections, "Sequential"))


@dataclass(frozen=True, init=False)
class Parallel:
    """Members are independent and may run in the same step."""

    sections: tuple["GraphSection", ...]

    def __init__(self, sections: Iterable["GraphSection"]) -> None:
        object.__setattr__(self, "sections", _section_tuple(sections, "Parallel"))


@dataclass(frozen=True, init=False)
class Loop:
    """`section` runs up to `max_iters` times; a stop names the loop by `name`.

    `outputs` leave once, with the last iteration's value per name;
    `accumulated_outputs` leave once, holding one value per iteration that ran.
    Both match the body's outputs by name.
    """

    section: "GraphSection"
    max_iters: int
    outputs: tuple[GraphEdge, ...]
    name: str
    accumulated_outputs: tuple[GraphEdge, ...]

    def __init__(
        self,
        section: "GraphSection",
        max_iters: int,
        outputs: Iterable[GraphEdge] = (),
        name: str = "",
        accumulated_outputs: Iterable[GraphEdge] = (),
    ) -> None:
        set_ = object.__setattr__
        set_(self, "name", _require_str(name, "Loop.name"))
        label = f"Loop {name!r}" if name else "Loop"
        if not isinstance(section, _SECTION_TYPES):
            raise GraphDeclarationError(
                f"{label}: section must be a GraphNode, Sequential, Parallel or Loop, "
                f"got {type(section).__name__}"
            )
        set_(self, "section", section)
        if isinstance(max_iters, bool) or not isinstance(max_iters, int):
            raise GraphDeclarationError(f"{label}: max_iters must be an int, got {type(max_iters).__name__}")
        set_(self, "max_iters", max_iters)
        set_(self, "outputs", _edge_tuple(outputs, f"{label}: outputs"))
        set_(self, "accumulated_outputs", _edge_tuple(accumulated_outputs, f"{label}: accumulated_outputs"))


GraphSection = Union[GraphNode, Sequential, Parallel, Loop]
_SECTION_TYPES = (GraphNode, Sequential, Parallel, Loop)


def iter_sections(section: GraphSection) -> Iterable[GraphSection]:
    """A section and everything inside it, parents first, in declaration order."""
    yield section
    if isinstance(section, Loop):
        yield from iter_sections(section.section)
    elif not isinstance(section, GraphNode):
        for member in section.sections:
            yield from iter_sections(member)


def iter_nodes(section: GraphSection) -> Iterable[GraphNode]:
    """The GraphNodes of a section, depth first in declaration order."""
    return (s for s in iter_sections(section) if isinstance(s, GraphNode))
