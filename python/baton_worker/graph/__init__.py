"""Baton's graph runtime, Python side: the model-authoring API (M*'s names),
the export of a model's graph as data, and the executor of stateless passes."""

from .authoring import (
    EMIT_TO_CLIENT,
    EMPTY_DESTINATION,
    EngineType,
    GraphDeclarationError,
    GraphEdge,
    GraphNode,
    GraphSection,
    Loop,
    Parallel,
    Sequential,
    StreamingGraphEdge,
)
from .export import export_graph
from .llm import LLMGraphModel
from .model import (
    ConductorMetadata,
    ForwardPassArgs,
    GraphModel,
    PartitionTransitions,
    Transition,
    WalkInput,
    WalkStep,
)
from .streaming import (
    Connection,
    FixedChunkPolicy,
    LeftContextChunkPolicy,
    PartitionTopology,
    SlidingWindowChunkPolicy,
)

__all__ = [
    "EMIT_TO_CLIENT",
    "EMPTY_DESTINATION",
    "ConductorMetadata",
    "Connection",
    "EngineType",
    "FixedChunkPolicy",
    "ForwardPassArgs",
    "GraphDeclarationError",
    "GraphEdge",
    "GraphModel",
    "GraphNode",
    "GraphSection",
    "LLMGraphModel",
    "LeftContextChunkPolicy",
    "Loop",
    "Parallel",
    "PartitionTopology",
    "PartitionTransitions",
    "Sequential",
    "SlidingWindowChunkPolicy",
    "StreamingGraphEdge",
    "Transition",
    "WalkInput",
    "WalkStep",
    "export_graph",
]
