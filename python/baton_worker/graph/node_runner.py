"""Worker-side execution of stateless node passes, independent of the wire.

The conductor hands a worker a batch of passes of one (node, walk), one pass per
request. `NodeRunner.run` resolves each pass's inputs, calls the node's
submodule ONCE for the whole batch, keeps the outputs in the worker's
`TensorStore` (the conductor only ever sees descriptors), turns outputs bound
for the client into bytes with the model's `postprocess`, and asks the
submodule which loops to stop.

Failures are isolated as docs/graph-semantics.md ("Failure isolation") says:
an exception in a per-request stage (input resolution, `prepare_inputs`,
`check_stop`, `postprocess`) fails that pass only; an exception in the batch
stage (`preprocess`, `forward`) fails every pass of the batch. Nothing escapes `run` as an exception except a
caller's mistake (a node this runner does not host).

Submodule contract (a `NodeSubmodule`, or any `torch.nn.Module` with the same
methods; all but `forward` are optional):
- `prepare_inputs(graph_walk, info, inputs) -> prepared`: per pass; `inputs`
  maps each declared input name to its list of tensors (empty for a signal).
- `preprocess(graph_walk, infos, prepared_list) -> batch`: collates the passes.
- `forward(graph_walk, infos, batch) -> list[dict[name, list[Tensor]]]`: one
  call for the batch, one output dict per pass, in order. A value may be a
  single tensor; a declared output left out is delivered empty (a signal).
- `check_stop(graph_walk, info, outputs) -> set[loop name]`: per pass.
- `cleanup_request(request_id)`: the request ended; drop its state.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np
import torch

from .authoring import EMIT_TO_CLIENT, EngineType, GraphEdge, GraphNode, iter_sections
from .model import GraphModel

log = logging.getLogger(__name__)


# ---- values ------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorDescriptor:
    """A tensor held by this worker's TensorStore, as the control plane sees it."""

    handle: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class TokenIds:
    """Token ids carried inline by the control plane (prompt ids, sampled ids)."""

    ids: np.ndarray  # int32, 1-D

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", np.ascontiguousarray(self.ids, dtype=np.int32).reshape(-1))


@dataclass(frozen=True)
class ReceivedTensor:
    """A tensor another worker produced, copied in for one pass (it has no handle here)."""

    tensor: torch.Tensor


InputValue = Union[TensorDescriptor, TokenIds, ReceivedTensor]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def is_token_ids(tensor: torch.Tensor) -> bool:
    """The one rule for prompt values: a 1-D integer tensor is token ids."""
    dtype = tensor.dtype
    return tensor.dim() == 1 and not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


# ---- the tensor store --------------------------------------------------------------


class TensorStore:
    """Tensors this worker owns, by handle, with owner-side reference counts.

    A tensor enters with the references its holders need (one for the
    conductor by default); `retain` adds one per extra consumer, `release`
    drops them, and the tensor is freed at zero. `len()` and `total_refs()`
    show that nothing leaks.
    """

    def __init__(self) -> None:
        self._tensors: dict[int, torch.Tensor] = {}
        self._refs: dict[int, int] = {}
        self._next_handle = 1

    def put(self, tensor: torch.Tensor, refs: int = 1) -> TensorDescriptor:
        if refs < 1:
            raise ValueError(f"a stored tensor needs at least one reference, got {refs}")
        handle = self._next_handle
        self._next_handle += 1
        self._tensors[handle] = tensor
        self._refs[handle] = refs
        return self.describe(handle)

    def get(self, handle: int) -> torch.Tensor:
        try:
            return self._tensors[handle]
        except KeyError:
            raise KeyError(f"tensor handle {handle} is not held by this worker (released or never stored)") from None

    def describe(self, handle: int) -> TensorDescriptor:
        tensor = self.get(handle)
        return TensorDescriptor(handle, dtype_name(tensor.dtype), tuple(tensor.shape))

    def retain(self, handle: int, count: int = 1) -> None:
        self.get(handle)
        self._refs[handle] += count

    def release(self, handle: int, count: int = 1) -> bool:
        """Drop `count` references; True when that freed the tensor."""
        refs = self._refs.get(handle)
        if refs is None:
            raise KeyError(f"tensor handle {handle} is not held by this worker (released twice?)")
        if count > refs:
            raise ValueError(f"tensor handle {handle}: releasing {count} references of {refs}")
        if refs == count:
            del self._refs[handle]
            del self._tensors[handle]
            return True
        self._refs[handle] = refs - count
        return False

    def refs(self, handle: int) -> int:
        return self._refs.get(handle, 0)

    def total_refs(self) -> int:
        return sum(self._refs.values())

    def __len__(self) -> int:
        return len(self._tensors)

    def __contains__(self, handle: object) -> bool:
        return handle in self._tensors


# ---- passes ------------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkInfo:
    """Where a streaming input's chunk sits in its stream: the first
    `context_count` items were already seen in earlier chunks."""

    index: int
    start: int
    context_count: int
    final: bool


@dataclass
class NodePass:
    """One request's run of a node, as the conductor asks for it."""

    pass_id: int
    request_id: int
    inputs: dict[str, list[InputValue]]
    chunks: dict[str, ChunkInfo] = field(default_factory=dict)
    step_metadata: dict[str, Any] = field(default_factory=dict)
    request_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PassInfo:
    """What a submodule sees of a pass (M*'s CurrentForwardPassInfo, reduced)."""

    pass_id: int
    request_id: int
    graph_walk: str
    node: str
    chunks: Mapping[str, ChunkInfo]
    step_metadata: Mapping[str, Any]
    request_kwargs: Mapping[str, Any]


@dataclass
class ClientChunk:
    name: str
    modality: str
    data: bytes
    metadata: dict[str, Any]


@dataclass
class PassResult:
    pass_id: int
    request_id: int
    outputs: dict[str, list[TensorDescriptor]] = field(default_factory=dict)
    client_chunks: list[ClientChunk] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    error: str | None = None


class NodeSubmodule(torch.nn.Module):
    """Base class with the contract's defaults: inputs pass through
    `prepare_inputs` unchanged and `preprocess` hands `forward` the list of them."""

    def prepare_inputs(self, graph_walk: str, info: PassInfo, inputs: dict[str, list[torch.Tensor]]) -> Any:
        return inputs

    def preprocess(self, graph_walk: str, infos: list[PassInfo], prepared: list[Any]) -> Any:
        return prepared

    def check_stop(self, graph_walk: str, info: PassInfo, outputs: dict[str, list[torch.Tensor]]) -> set[str]:
        return set()

    def cleanup_request(self, request_id: int) -> None:
        pass


# ---- the runner --------------------------------------------------------------------


@dataclass(frozen=True)
class _NodeOutputs:
    stored: tuple[str, ...]  # names kept in the store (they feed nodes, persist or stream)
    emitted: tuple[tuple[str, str], ...]  # (name, modality) bound for the client


def _node_outputs(edges: Sequence[GraphEdge]) -> _NodeOutputs:
    stored: list[str] = []
    emitted: list[tuple[str, str]] = []
    for edge in edges:
        if edge.next_node == EMIT_TO_CLIENT:
            if (edge.name, edge.output_modality) not in emitted:
                emitted.append((edge.name, edge.output_modality))
        if (edge.next_node != EMIT_TO_CLIENT or edge.persist) and edge.name not in stored:
            stored.append(edge.name)
    return _NodeOutputs(tuple(stored), tuple(emitted))


def _describe_error(stage: str, exc: BaseException) -> str:
    return f"{stage}: {type(exc).__name__}: {exc}"


class NodeRunner:
    """Runs the stateless nodes this worker hosts, over one TensorStore."""

    def __init__(
        self,
        model: GraphModel,
        device: str | torch.device = "cpu",
        nodes: Sequence[str] | None = None,
        store: TensorStore | None = None,
    ) -> None:
        self.model = model
        self.device = torch.device(device)
        self.store = store if store is not None else TensorStore()
        engines = {name: EngineType(kind) for name, kind in model.get_node_engine_types().items()}
        hosted = list(nodes) if nodes is not None else [n for n, e in engines.items() if e is EngineType.STATELESS]
        self.submodules: dict[str, torch.nn.Module] = {}
        for name in hosted:
            if engines.get(name) is not EngineType.STATELESS:
                raise ValueError(f"node {name!r} is not a stateless node of {type(model).__name__}")
            module = model.get_submodule(name, self.device)
            if not isinstance(module, torch.nn.Module):
                raise ValueError(f"{type(model).__name__}.get_submodule({name!r}) returned no torch.nn.Module")
            self.submodules[name] = module.eval()
        # (walk, node) -> what its edges do with its outputs; a node placed twice
        # in one walk gets the union of its edges.
        edges: dict[tuple[str, str], list[GraphEdge]] = {}
        for walk, root in model.get_graph_walk_graphs().items():
            for sec in iter_sections(root):
                if isinstance(sec, GraphNode) and sec.name in self.submodules:
                    edges.setdefault((walk, sec.name), []).extend(sec.outputs)
        self._outputs = {key: _node_outputs(value) for key, value in edges.items()}
        self._sample_rate = model.get_output_sample_rate("audio")

    # -- admission -------------------------------------------------------------------

    def process_prompt(
        self,
        prompt: str | None,
        input_modalities: Sequence[str],
        output_modalities: Sequence[str],
        tensors: Mapping[str, list[torch.Tensor]] | None = None,
        **kwargs: Any,
    ) -> dict[str, list[InputValue]]:
        """Run the model's `process_prompt` for one request. Token ids come back
        inline; other tensors are stored here (one reference, the conductor's).
        Raises whatever the model raised: the request is refused."""
        values = self.model.process_prompt(prompt, input_modalities, output_modalities, tensors, **kwargs)
        result: dict[str, list[InputValue]] = {}
        try:
            for name, tensor_list in values.items():
                if isinstance(tensor_list, torch.Tensor):
                    tensor_list = [tensor_list]
                out: list[InputValue] = []
                result[name] = out
                for tensor in tensor_list:
                    if not isinstance(tensor, torch.Tensor):
                        raise TypeError(f"process_prompt value {name!r} holds a {type(tensor).__name__}, not a tensor")
                    if is_token_ids(tensor):
                        out.append(TokenIds(tensor.detach().to("cpu").numpy()))
                    else:
                        out.append(self.store.put(tensor.detach().to(self.device)))
        except BaseException:
            self.release_values(v for vs in result.values() for v in vs)
            raise
        return result

    # -- passes ----------------------------------------------------------------------

    def run(self, node: str, graph_walk: str, passes: Sequence[NodePass]) -> list[PassResult]:
        module = self.submodules.get(node)
        if module is None:
            raise ValueError(f"this worker does not host stateless node {node!r}")
        declared = self._outputs.get((graph_walk, node))
        if declared is None:
            raise ValueError(f"walk {graph_walk!r} has no node {node!r}")

        results = [PassResult(p.pass_id, p.request_id) for p in passes]
        infos = [
            PassInfo(
                p.pass_id, p.request_id, graph_walk, node, dict(p.chunks), dict(p.step_metadata), dict(p.request_kwargs)
            )
            for p in passes
        ]

        prepare = getattr(module, "prepare_inputs", None)
        live: list[int] = []
        prepared: list[Any] = []
        for i, p in enumerate(passes):
            try:
                inputs = self._resolve_inputs(p)
                prepared.append(prepare(graph_walk, infos[i], inputs) if prepare else inputs)
                live.append(i)
            except Exception as exc:
                results[i].error = self._fail(node, "prepare_inputs", exc, p)
        if not live:
            return results

        live_infos = [infos[i] for i in live]
        try:
            with torch.inference_mode():
                preprocess = getattr(module, "preprocess", None)
                batch = preprocess(graph_walk, live_infos, prepared) if preprocess else prepared
                produced = module(graph_walk, live_infos, batch)
            if not isinstance(produced, (list, tuple)) or len(produced) != len(live):
                raise TypeError(
                    f"forward must return one output dict per pass ({len(live)}), got {type(produced).__name__}"
                    + (f" of length {len(produced)}" if isinstance(produced, (list, tuple)) else "")
                )
        except Exception as exc:
            message = _describe_error(f"node {node!r}: forward", exc)
            log.warning("node %s walk %s: forward failed for %d passes", node, graph_walk, len(live), exc_info=exc)
            for i in live:
                results[i].error = message
            return results

        for i, outputs in zip(live, produced):
            self._finish_pass(module, node, declared, infos[i], outputs, results[i])
        return results

    def _resolve_inputs(self, p: NodePass) -> dict[str, list[torch.Tensor]]:
        inputs: dict[str, list[torch.Tensor]] = {}
        for name, values in p.inputs.items():
            tensors: list[torch.Tensor] = []
            for value in values:
                if isinstance(value, TensorDescriptor):
                    tensors.append(self.store.get(value.handle))
                elif isinstance(value, TokenIds):
                    tensors.append(torch.from_numpy(value.ids.astype(np.int64)).to(self.device))
                elif isinstance(value, ReceivedTensor):
                    tensors.append(value.tensor.to(self.device))
                else:
                    raise TypeError(f"input {name!r}: unexpected value {type(value).__name__}")
            inputs[name] = tensors
        return inputs

    def _finish_pass(
        self,
        module: torch.nn.Module,
        node: str,
        declared: _NodeOutputs,
        info: PassInfo,
        raw: object,
        result: PassResult,
    ) -> None:
        stage = "outputs"
        try:
            outputs = _normalise_outputs(raw)
            stage = "check_stop"
            check_stop = getattr(module, "check_stop", None)
            stops = check_stop(info.graph_walk, info, outputs) if check_stop else set()
            if isinstance(stops, str) or not all(isinstance(s, str) for s in stops or ()):
                raise TypeError("check_stop must return a set of loop names")
            stage = "postprocess"
            chunks = [
                self._client_chunk(name, modality, tensor, info.request_kwargs)
                for name, modality in declared.emitted
                for tensor in outputs.get(name, [])
            ]
        except Exception as exc:
            result.error = self._fail(node, stage, exc, info)
            return
        result.stops = sorted(stops or ())
        result.client_chunks = chunks
        # Stored last: a failed pass above leaves nothing behind in the store.
        result.outputs = {
            name: [self.store.put(t.detach()) for t in outputs.get(name, [])] for name in declared.stored
        }

    def _client_chunk(
        self, name: str, modality: str, tensor: torch.Tensor, request_kwargs: Mapping[str, Any]
    ) -> ClientChunk:
        data = self.model.postprocess(tensor, modality, dict(request_kwargs))
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"postprocess must return bytes, got {type(data).__name__}")
        metadata: dict[str, Any] = {"output": name}
        if modality == "audio" and self._sample_rate is not None:
            metadata["sample_rate"] = self._sample_rate
        return ClientChunk(name, modality, bytes(data), metadata)

    def _fail(self, node: str, stage: str, exc: Exception, who: NodePass | PassInfo) -> str:
        log.warning("node %s: %s failed for request %s", node, stage, who.request_id, exc_info=exc)
        return _describe_error(f"node {node!r}: {stage}", exc)

    # -- outputs the conductor sends to the client later (loop outputs) --------------

    def postprocess_stored(
        self,
        name: str,
        values: Sequence[TensorDescriptor],
        modality: str,
        request_kwargs: Mapping[str, Any] | None = None,
    ) -> list[ClientChunk]:
        """Client bytes for stored tensors (a loop's outputs bound for the client).
        Raises on failure: the caller fails that request. Releases nothing."""
        return [self._client_chunk(name, modality, self.store.get(v.handle), request_kwargs or {}) for v in values]

    # -- lifetime ----------------------------------------------------------------------

    def release_values(self, values: Any) -> None:
        """Drop the conductor's reference to each stored value (token ids hold none)."""
        for value in values:
            if isinstance(value, TensorDescriptor):
                self.store.release(value.handle)

    def finish_request(self, request_id: int) -> None:
        """The request ended: let every submodule drop its per-request state."""
        for name, module in self.submodules.items():
            cleanup: Callable[[str], None] | None = getattr(module, "cleanup_request", None)
            if cleanup is None:
                continue
            try:
                cleanup(request_id)
            except Exception as exc:  # the request is over; a failing cleanup must not fail others
                log.warning("node %s: cleanup_request failed for %s", name, request_id, exc_info=exc)


def _normalise_outputs(raw: object) -> dict[str, list[torch.Tensor]]:
    if not isinstance(raw, Mapping):
        raise TypeError(f"a pass's outputs must be a dict of name -> tensors, got {type(raw).__name__}")
    outputs: dict[str, list[torch.Tensor]] = {}
    for name, value in raw.items():
        if value is None:
            values: list[Any] = []
        elif isinstance(value, torch.Tensor):
            values = [value]
        else:
            values = list(value)
        for t in values:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"output {name!r} holds a {type(t).__name__}, not a tensor")
        outputs[name] = values
    return outputs
