"""Partitions and the streaming connections between them (M*'s names).

A chunk policy here is only its parameters: the TypeScript conductor cuts the
chunks (index, start offset, context count, final flag) from the exported
numbers, so a policy object holds no buffer state and one serves every request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Union

from .authoring import GraphDeclarationError, _require_bool, _require_nonempty_str


def _require_int(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GraphDeclarationError(f"{what} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise GraphDeclarationError(f"{what} must be >= {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class FixedChunkPolicy:
    """Non-overlapping chunks of `chunk_size` items.

    With `continue_after_done` the consumer keeps being triggered (with empty
    chunks) after the producer ended and never gets a final chunk: it ends its
    partition by its own logic.
    """

    chunk_size: int
    continue_after_done: bool = False

    def __post_init__(self) -> None:
        _require_int(self.chunk_size, "FixedChunkPolicy.chunk_size", 1)
        _require_bool(self.continue_after_done, "FixedChunkPolicy.continue_after_done")


@dataclass(frozen=True)
class SlidingWindowChunkPolicy:
    """Chunks of `window` items, each starting `stride` items after the last."""

    window: int
    stride: int

    def __post_init__(self) -> None:
        _require_int(self.window, "SlidingWindowChunkPolicy.window", 1)
        _require_int(self.stride, "SlidingWindowChunkPolicy.stride", 1)


@dataclass(frozen=True)
class LeftContextChunkPolicy:
    """`chunk` new items per chunk, after the first preceded by `left_context`
    items the consumer has already seen (for causal decoders to warm up)."""

    chunk: int
    left_context: int

    def __post_init__(self) -> None:
        _require_int(self.chunk, "LeftContextChunkPolicy.chunk", 1)
        _require_int(self.left_context, "LeftContextChunkPolicy.left_context", 0)


ChunkPolicy = Union[FixedChunkPolicy, SlidingWindowChunkPolicy, LeftContextChunkPolicy]
CHUNK_POLICY_TYPES = (FixedChunkPolicy, SlidingWindowChunkPolicy, LeftContextChunkPolicy)


@dataclass(frozen=True)
class Connection:
    """Values of `edge_name` produced in `from_partition` stream into
    `to_partition`, cut into chunks by the policy `chunk_policy_factory()` makes.

    The factory is M*'s form (it made a fresh stateful policy per request); here
    it is called once, at export, to read the policy's parameters.
    """

    from_partition: str
    to_partition: str
    edge_name: str
    chunk_policy_factory: Callable[[], ChunkPolicy]

    def __post_init__(self) -> None:
        _require_nonempty_str(self.from_partition, "Connection.from_partition")
        _require_nonempty_str(self.to_partition, "Connection.to_partition")
        _require_nonempty_str(self.edge_name, "Connection.edge_name")
        if not callable(self.chunk_policy_factory):
            raise GraphDeclarationError(
                f"Connection {self.edge_name!r}: chunk_policy_factory must be callable "
                "(e.g. lambda: SlidingWindowChunkPolicy(28, 7))"
            )

    def chunk_policy(self) -> ChunkPolicy:
        policy = self.chunk_policy_factory()
        if not isinstance(policy, CHUNK_POLICY_TYPES):
            raise GraphDeclarationError(
                f"Connection {self.edge_name!r}: chunk policy {type(policy).__name__} is not one of "
                "FixedChunkPolicy, SlidingWindowChunkPolicy, LeftContextChunkPolicy"
            )
        return policy


@dataclass(frozen=True, init=False)
class PartitionTopology:
    """The model's partitions (independent walk sequences) and their connections."""

    partitions: tuple[str, ...]
    connections: tuple[Connection, ...]

    def __init__(self, partitions: Iterable[str], connections: Iterable[Connection] = ()) -> None:
        if isinstance(partitions, (str, bytes)):
            raise GraphDeclarationError("PartitionTopology.partitions must be a list of str")
        names = tuple(partitions)
        if not names:
            raise GraphDeclarationError("PartitionTopology.partitions must not be empty")
        for i, name in enumerate(names):
            _require_nonempty_str(name, f"PartitionTopology.partitions[{i}]")
        if len(set(names)) != len(names):
            raise GraphDeclarationError("PartitionTopology.partitions has a duplicate")
        conns = tuple(connections)
        for i, conn in enumerate(conns):
            if not isinstance(conn, Connection):
                raise GraphDeclarationError(
                    f"PartitionTopology.connections[{i}] must be a Connection, got {type(conn).__name__}"
                )
        object.__setattr__(self, "partitions", names)
        object.__setattr__(self, "connections", conns)
