"""A worker's Step executor for graph models: the wire side of NodeRunner and StepRunner.

One Step carries a worker's whole share of a conductor step. `GraphStepRunner`
runs it in the schema's order (protocol/schema.json, Step semantics), its graph
work (`Step.graph`) around the rows:

1. `releases`: the control plane drops its reference to each handle of this
   worker's TensorStore (a handle this worker does not hold is a ProtocolError:
   a double release is a bug in the control plane, not a request's failure);
2. `finished_requests`: every hosted node drops the request's state;
3. `prompts`: the model's `process_prompt` per request; a 1-D integer tensor
   comes back inline ("tokens"), anything else stays here ("tensor" with its
   handle and this worker's rank); an exception refuses that request only;
4. the KV rows (added, removed, rows) through the StepRunner of the kv_cache
   node this worker hosts, after its LoRA work (`Step.lora`, which that
   StepRunner applies first); rows or LoRA work on a worker without one are a
   ProtocolError;
5. each PassBatch through NodeRunner.run: one batched call of a stateless node.

Tensors for other workers (protocol/schema.json "Tensors between workers"):
a batch's `publish` names the outputs a worker of another rank consumes (a
prompt request's, its values); this worker copies those tensors into its
shared-memory arena as well and describes the block beside the handle. The
block is freed with the handle, when the control plane releases it. A consumer
copies a published input out of the producer's segment while it resolves the
pass's inputs. A tensor that does not fit fails its request only.

Pass failures never leave the loop as exceptions: a bad input fails its pass
(a tensor of another worker that it did not publish or whose segment is gone,
an unknown handle or value form, a request's kwargs that are not a map), a failing forward fails its batch, and a batch for
a node this worker does not host fails every pass of it with a line saying why.

Timings: the graph work before the rows (releases, finished requests, prompts)
is added to `prepare_ms`, the pass batches (forward and postprocess) to
`forward_ms`; `sample_ms` stays the rows' sampling.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Mapping

import numpy as np

from .. import protocol
from ..kv_connector import KvConnectorWorker
from ..protocol import GraphWork, KvWork, ProtocolError, Step, StepMask, StepResult, StepTimings
from ..runtime.step_runner import Finished, StepRunner
from ..transfer.shm import ShmArena, ShmFull, ShmReader, ShmRef
from .authoring import EngineType
from .node_runner import (
    ChunkInfo,
    InputValue,
    ReceivedTensor,
    NodePass,
    NodeRunner,
    PassResult,
    TensorDescriptor,
    TokenIds,
)

# What a step without graph work or a KV transfer carries of them (Step.graph / Step.kv are nil).
NO_GRAPH_WORK = GraphWork()
NO_KV_WORK = KvWork()

# Step fields that drive the KV rows: any of them non-empty needs a kv_cache node here.
_KV_FIELDS = ("added", "removed", "req_ids", "num_new_tokens", "num_computed", "new_block_counts", "new_block_ids", "sample", "mask_rows")


def one_line(text: str) -> str:
    return " ".join(text.split())


class PassInputError(Exception):
    """A pass's inputs cannot be resolved on this worker: fails that pass only."""


class GraphStepRunner:
    """Executes Steps for the nodes one worker hosts (see the module docstring).

    kv: the StepRunner of the hosted kv_cache node `kv_node` (None: this
    worker hosts none); nodes: the NodeRunner over the hosted stateless nodes;
    rank: this worker's rank, the `worker` of every tensor it describes;
    arena: where it publishes tensors for other workers (None: it cannot).
    """

    def __init__(
        self,
        nodes: NodeRunner,
        kv: StepRunner | None = None,
        kv_node: str | None = None,
        rank: int = 0,
        arena: ShmArena | None = None,
        kv_connector: KvConnectorWorker | None = None,
    ):
        if (kv is None) != (kv_node is None):
            raise ValueError("a kv StepRunner and the kv_cache node it runs come together")
        self.nodes = nodes
        self.kv = kv
        self.kv_node = kv_node
        self.rank = rank
        self.engines = {name: EngineType(kind) for name, kind in nodes.model.get_node_engine_types().items()}
        self.hosted = ([kv_node] if kv_node else []) + list(nodes.submodules)
        if kv is not None:
            # Prompt embeddings (AddedRequest.embeds) are tensors of this worker's store.
            kv.embeds_of = nodes.store.get
        self.arena = arena
        # Prefill/decode disaggregation: moves this worker's KV blocks to and from its peers.
        self.kv_connector = kv_connector
        self.reader = ShmReader()
        # Handle -> its block in the arena, for the handles published so far.
        self.published: dict[int, ShmRef] = {}

    def close(self) -> None:
        """Unmaps the segments read and unlinks this worker's arena."""
        self.reader.close()
        if self.kv_connector is not None:
            self.kv_connector.close()
        if self.arena is not None:
            self.arena.close()

    def overlaps(self, step: Step) -> bool:
        """Whether `step` may be launched before the previous step is finished:
        rows only (no graph work, no KV transfer, no connector), which the
        decoder's StepRunner can overlap."""
        return self.kv is not None and step.graph is None and step.kv is None and self.kv_connector is None and self.kv.overlaps(step)

    def launch(self, step: Step, wait_mask: Callable[[int], StepMask] | None = None, overlaps: bool | None = None):
        """The step launched (finish() gives its result): overlappable steps only
        queued on the device, any other step run whole. overlaps: overlaps(step),
        when the caller has it already."""
        if self.overlaps(step) if overlaps is None else overlaps:
            return self.kv.launch(step, wait_mask)
        return Finished(self.execute(step, wait_mask))

    def execute(self, step: Step, wait_mask: Callable[[int], StepMask] | None = None) -> StepResult:
        """wait_mask: how the rows' StepRunner waits for the grammar masks of a step with mask_rows."""
        t0 = time.perf_counter()
        graph = step.graph or NO_GRAPH_WORK
        kv = step.kv or NO_KV_WORK
        self._release(graph.releases)
        for request_id in graph.finished_requests.tolist():
            self.nodes.finish_request(request_id)
            if self.kv is not None and self.kv.frames is not None:
                self.kv.frames.release(request_id)
        prompt_results = [self._prompt(p) for p in graph.prompts]
        # KV connector: cancels first (before any load is written), sends copied out before the forward.
        connector = self.kv_connector
        if connector is not None:
            connector.cancel(kv.cancels)
            connector.start_sends(kv.sends)
            connector.start_loads(kv.loads)
        t1 = time.perf_counter()
        result = self._rows(step, wait_mask)
        t2 = time.perf_counter()
        pass_results = [r for batch in graph.batches for r in self._batch(batch)]
        t3 = time.perf_counter()
        result.prompt_results = prompt_results
        result.pass_results = pass_results
        if connector is not None:
            # A step with nothing else to do only asks how the loads stand: it waits a little for one.
            idle = not len(step.req_ids) and not graph.batches and not graph.prompts and not kv.loads
            report = connector.poll(0.02 if idle and connector.has_pending_loads else 0.0)
            result.kv_loaded = np.asarray(report.loaded, np.int32)
            result.kv_load_failed = np.asarray(report.failed, np.int32)
            result.kv_load_errors = report.errors
            result.kv_bytes = report.nbytes
        elif kv.loads:
            result.kv_load_failed = np.asarray([t.transfer_id for t in kv.loads], np.int32)
            result.kv_load_errors = [f"worker {self.rank} has no KV connector"] * len(kv.loads)
        result.timings.prepare_ms += (t1 - t0) * 1e3
        result.timings.forward_ms += (t3 - t2) * 1e3
        return result

    # -- 1. releases --------------------------------------------------------------------

    def _release(self, handles: np.ndarray) -> None:
        if not len(handles):
            return
        store = self.nodes.store
        wanted: dict[int, int] = {}
        for i, handle in enumerate(handles.tolist()):
            wanted[handle] = wanted.get(handle, 0) + 1
            if store.refs(handle) < wanted[handle]:
                # Checked before anything is freed: a bad step changes nothing.
                raise ProtocolError(
                    f"Step.graph.releases[{i}]", f"tensor handle {handle} is not held by worker {self.rank} (released twice?)"
                )
        for handle, count in wanted.items():
            if store.release(handle, count):
                self._unpublish(handle)

    # -- 3. prompts ---------------------------------------------------------------------

    def _prompt(self, request: protocol.PromptRequest) -> protocol.PromptResult:
        try:
            kwargs = _as_kwargs(request.kwargs, "kwargs")
            values = self.nodes.process_prompt(
                request.prompt, list(request.input_modalities), list(request.output_modalities), **kwargs
            )
        except Exception as exc:
            return protocol.PromptResult(request.request_id, one_line(f"process_prompt: {type(exc).__name__}: {exc}"))
        try:
            self._publish(values, request.publish)
        except ShmFull as exc:
            self._drop(values)
            return protocol.PromptResult(request.request_id, one_line(f"process_prompt: {exc}"))
        return protocol.PromptResult(
            request.request_id,
            None,
            [protocol.NamedValues(name, [self._wire_value(v) for v in items]) for name, items in values.items()],
        )

    def _wire_value(self, value: InputValue) -> protocol.WireValue:
        if isinstance(value, TokenIds):
            return protocol.WireValue("tokens", ids=value.ids)
        if not isinstance(value, TensorDescriptor):
            raise TypeError(f"a {type(value).__name__} is not a value this worker describes")
        ref = self.published.get(value.handle)
        return protocol.WireValue(
            "tensor",
            handle=value.handle,
            worker=self.rank,
            dtype=value.dtype,
            shape=list(value.shape),
            segment=ref.segment if ref else "",
            offset=ref.offset if ref else 0,
            nbytes=ref.nbytes if ref else 0,
        )

    # -- shared memory ------------------------------------------------------------------

    def _publish(self, values: Mapping[str, list[Any]], names: list[str]) -> None:
        """Copies the stored tensors named in `names` into the arena. Raises ShmFull
        (nothing stays published) when one does not fit or there is no arena."""
        done: list[int] = []
        try:
            for name in names:
                for value in values.get(name, ()):
                    if not isinstance(value, TensorDescriptor) or value.handle in self.published:
                        continue
                    if self.arena is None:
                        raise ShmFull(f"worker {self.rank} has no shared-memory arena (--shm-bytes) to publish {name!r}")
                    self.published[value.handle] = self.arena.put(self.nodes.store.get(value.handle))
                    done.append(value.handle)
        except BaseException:
            for handle in done:
                self._unpublish(handle)
            raise

    def _unpublish(self, handle: int) -> None:
        ref = self.published.pop(handle, None)
        if ref is not None and self.arena is not None:
            self.arena.free(ref)

    def _drop(self, values: Mapping[str, list[Any]]) -> None:
        """Releases a result's stored tensors: it failed, nobody will refer to them."""
        for items in values.values():
            for value in items:
                if isinstance(value, TensorDescriptor) and self.nodes.store.release(value.handle):
                    self._unpublish(value.handle)

    # -- 4. KV rows ---------------------------------------------------------------------

    def _rows(self, step: Step, wait_mask: Callable[[int], StepMask] | None) -> StepResult:
        used = next((name for name in _KV_FIELDS if len(getattr(step, name))), None)
        if used is None and step.lora is not None:
            used = "lora"  # a step of LoRA work only: the StepRunner applies it (or refuses it)
        if used is not None:
            if self.kv is None:
                raise ProtocolError(
                    f"Step.{used}", f"worker {self.rank} hosts no kv_cache node (it hosts {', '.join(self.hosted)})"
                )
            return self.kv.execute(step, wait_mask)
        empty = np.zeros(0, np.int32)
        return StepResult(step.step_id, empty, empty, None, None, None, None, StepTimings())

    # -- 5. pass batches ----------------------------------------------------------------

    def _batch(self, batch: protocol.PassBatch) -> list[protocol.PassResult]:
        refusal = self._refusal(batch.node)
        if refusal is not None:
            return [protocol.PassResult(p.pass_id, refusal) for p in batch.passes]
        results: list[protocol.PassResult | None] = [None] * len(batch.passes)
        live: list[int] = []
        passes: list[NodePass] = []
        for i, wire in enumerate(batch.passes):
            try:
                passes.append(self._node_pass(wire))
                live.append(i)
            except PassInputError as exc:
                results[i] = protocol.PassResult(wire.pass_id, one_line(f"node {batch.node!r}: inputs: {exc}"))
        if passes:
            try:
                ran = self.nodes.run(batch.node, batch.walk, passes)
            except Exception as exc:  # a walk without this node: the whole batch is wrong
                message = one_line(f"node {batch.node!r}: {type(exc).__name__}: {exc}")
                ran = [PassResult(p.pass_id, p.request_id, error=message) for p in passes]
            for i, result in zip(live, ran, strict=True):
                results[i] = self._wire_result(result, batch.publish, batch.node)
        return results  # type: ignore[return-value]  (every slot is filled above)

    def _refusal(self, node: str) -> str | None:
        """Why this worker cannot run a batch of `node`, or None when it can."""
        if node in self.nodes.submodules:
            return None
        model = type(self.nodes.model).__name__
        engine = self.engines.get(node)
        if engine is None:
            return f"{model} has no node {node!r} (nodes: {', '.join(self.engines)})"
        if engine is EngineType.KV_CACHE:
            return f"node {node!r} is a kv_cache node: the engine core runs it through a step's rows, not a pass batch"
        return f"node {node!r} is not hosted by worker {self.rank} (it hosts {', '.join(self.hosted) or 'nothing'})"

    def _node_pass(self, wire: protocol.NodePass) -> NodePass:
        inputs: dict[str, list[InputValue]] = {}
        for named in wire.inputs:
            if named.name in inputs:
                raise PassInputError(f"input {named.name!r} is given twice")
            resolved = (self._input_value(named.name, value) for value in named.values)
            inputs[named.name] = [v for v in resolved if v is not None]
        chunks: dict[str, ChunkInfo] = {}
        for chunk in wire.chunks:
            if chunk.name in chunks:
                raise PassInputError(f"chunk position of {chunk.name!r} is given twice")
            chunks[chunk.name] = ChunkInfo(chunk.index, chunk.start, chunk.context_count, chunk.final)
        try:
            kwargs = _as_kwargs(wire.request_kwargs, "request_kwargs")
        except TypeError as exc:
            raise PassInputError(str(exc)) from None
        return NodePass(wire.pass_id, wire.request_id, inputs, chunks, request_kwargs=kwargs)

    def _input_value(self, name: str, value: protocol.WireValue) -> InputValue | None:
        if value.form == "tokens":
            return TokenIds(value.ids)
        if value.form == "empty":
            return None
        if value.form == "tensor":
            if value.worker != self.rank:
                return ReceivedTensor(self._read_shared(name, value))
            if value.handle not in self.nodes.store:
                raise PassInputError(f"input {name!r}: tensor handle {value.handle} is not held by worker {self.rank}")
            return TensorDescriptor(value.handle, value.dtype, tuple(value.shape))
        raise PassInputError(f"input {name!r}: unknown value form {value.form!r} (tokens, tensor or empty)")

    def _read_shared(self, name: str, value: protocol.WireValue) -> Any:
        if not value.segment:
            raise PassInputError(
                f"input {name!r}: tensor handle {value.handle} lives on worker {value.worker}, "
                f"which did not publish it to shared memory"
            )
        ref = ShmRef(value.segment, value.offset, value.nbytes, value.dtype, tuple(value.shape))
        try:
            return self.reader.read(ref, self.nodes.device)
        except (OSError, ValueError, RuntimeError) as exc:
            raise PassInputError(f"input {name!r} from worker {value.worker}: {exc}") from None

    def _wire_result(self, result: PassResult, publish: list[str], node: str) -> protocol.PassResult:
        if result.error is None and publish:
            try:
                self._publish(result.outputs, publish)
            except ShmFull as exc:
                self._drop(result.outputs)
                return protocol.PassResult(result.pass_id, one_line(f"node {node!r}: outputs: {exc}"))
        return protocol.PassResult(
            result.pass_id,
            one_line(result.error) if result.error is not None else None,
            [
                protocol.NamedValues(name, [self._wire_value(d) for d in stored])
                for name, stored in result.outputs.items()
            ],
            [
                protocol.ClientChunk(c.name, c.modality, np.frombuffer(c.data, np.uint8), c.metadata)
                for c in result.client_chunks
            ],
            list(result.stops),
        )


def _as_kwargs(value: Any, field: str) -> dict[str, Any]:
    """A request's keyword arguments from the wire (an `any` field): a map; its keys are str on the wire."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{field} must be a map, got {type(value).__name__}")
    return dict(value)
