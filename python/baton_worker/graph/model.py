"""`GraphModel`: the base class a model subclasses, and its walk transitions.

A model declares its nodes (engine kind per node), its walks (one graph each),
its partitions and their streaming connections, and how each partition moves
from walk to walk. Baton's transitions are declarative data
(`get_walk_transitions`), so the TypeScript conductor applies them without a
Python call per walk. M*'s hooks `get_initial_forward_pass_args` and
`get_partition_forward_pass_args` keep their names; their defaults apply the
declarative transitions, and a model that overrides either is exported as a
"python-transitions" model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Literal, Mapping, Sequence

import torch

from .authoring import (
    EngineType,
    GraphDeclarationError,
    GraphNode,
    GraphSection,
    Loop,
    _require_nonempty_str,
    _require_str,
    iter_nodes,
    iter_sections,
)
from .streaming import PartitionTopology

if TYPE_CHECKING:
    from ..model.config import ModelConfig


@dataclass(frozen=True)
class KvDecoderLayout:
    """A kv_cache node's decoder inside a composite model directory.

    text_config: the key of config.json with the decoder's config;
    rename: maps a plain decoder's weight name (model.layers.0...) to the stored one;
    embeds_token_ids: the prompt tokens whose embeddings AddedRequest.embeds rows
    replace, in prompt order (a vision-language model's image token; Qwen3-Omni's
    audio and image tokens), or none.
    deepstack_layers: D > 0 when each embeds row carries, after the row itself, D
    more rows of the same width added to the residual stream after decoder layers
    0..D-1 (Qwen3-Omni's vision features; zeros where a row has none, such as an
    audio token's, which adds nothing).
    """

    text_config: str | None
    rename: Callable[[str], str]
    embeds_token_ids: tuple[int, ...] = ()
    deepstack_layers: int = 0
    # A decoder other than the Llama-family DecoderModel (Whisper's), or None: its config from the
    # directory (it sizes the KV cache), the model from that config and a weight reader, whether it
    # cross-attends an encoder output (AddedRequest.encoder_states), and its logits rules from the
    # directory (StepRunner.logits_rules; None: none).
    read_config: Callable[[Path], ModelConfig] | None = None
    make_decoder: Callable[[ModelConfig, Any], Any] | None = None
    cross_attention: bool = False
    logits_rules: Callable[[Path], Any] | None = None
    # A frame model (CSM): from the directory and the model, the StepRunner's frame inputs and frame sampling
    # (StepRunner.frames; AddedRequest.embeds holds the prompt's frames, StepResult.frames the sampled ones).
    frames: Callable[[Path, Any], Any] | None = None

DEFAULT_PARTITION = "default"
# What a kv_cache node's prefill inputs after its token ids may be (GraphModel.get_kv_input_roles).
KV_INPUT_ROLES = ("embeds", "positions", "encoder_states")

WalkInputSource = Literal["prompt", "persist"]


@dataclass(frozen=True)
class WalkInput:
    """Input `name` of `node` for the next walk, taken from the request's prompt
    values (what `process_prompt` returned) or from a persisted value, both by
    `source_name`."""

    node: str
    name: str
    source: WalkInputSource
    source_name: str

    def __post_init__(self) -> None:
        _require_nonempty_str(self.node, "WalkInput.node")
        _require_nonempty_str(self.name, "WalkInput.name")
        if self.source not in ("prompt", "persist"):
            raise GraphDeclarationError(
                f"WalkInput {self.node}.{self.name}: source must be 'prompt' or 'persist', got {self.source!r}"
            )
        _require_nonempty_str(self.source_name, f"WalkInput {self.node}.{self.name}: source_name")


@dataclass(frozen=True, init=False)
class WalkStep:
    """Run `walk` next with `inputs`, after releasing the persisted values named
    in `release`. Walk "" means the partition is done."""

    walk: str
    inputs: tuple[WalkInput, ...]
    release: tuple[str, ...]

    def __init__(self, walk: str, inputs: Iterable[WalkInput] = (), release: Iterable[str] = ()) -> None:
        object.__setattr__(self, "walk", _require_str(walk, "WalkStep.walk"))
        ins = tuple(inputs)
        for i, item in enumerate(ins):
            if not isinstance(item, WalkInput):
                raise GraphDeclarationError(f"WalkStep {walk!r}: inputs[{i}] must be a WalkInput")
        if isinstance(release, (str, bytes)):
            raise GraphDeclarationError(f"WalkStep {walk!r}: release must be a list of str")
        rel = tuple(release)
        for i, name in enumerate(rel):
            _require_nonempty_str(name, f"WalkStep {walk!r}: release[{i}]")
        object.__setattr__(self, "inputs", ins)
        object.__setattr__(self, "release", rel)

    @property
    def done(self) -> bool:
        return self.walk == ""


@dataclass(frozen=True, init=False)
class PartitionTransitions:
    """Where a partition starts (None: inactive from the start) and, per walk,
    what follows when that walk ends."""

    start: WalkStep | None
    after: Mapping[str, WalkStep]

    def __init__(self, start: WalkStep | None, after: Mapping[str, WalkStep] | None = None) -> None:
        if start is not None and not isinstance(start, WalkStep):
            raise GraphDeclarationError("PartitionTransitions.start must be a WalkStep or None")
        steps = dict(after or {})
        for walk, step in steps.items():
            _require_nonempty_str(walk, "PartitionTransitions.after key")
            if not isinstance(step, WalkStep):
                raise GraphDeclarationError(f"PartitionTransitions.after[{walk!r}] must be a WalkStep")
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "after", steps)


# The contract's short name for a partition's declarative transitions.
Transition = PartitionTransitions


@dataclass
class ConductorMetadata:
    """What a transition hook knows about a request's partition (M*'s
    CurrentForwardConductorMetadata): the walk that just ended and the model's
    own state in `kwargs`, kept across walks."""

    graph_walk: str
    input_modalities: list[str] = field(default_factory=list)
    output_modalities: list[str] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    prompt_signals: dict[str, list[Any]] = field(default_factory=dict)


@dataclass
class ForwardPassArgs:
    """A transition hook's answer: run `graph_walk` next with `inputs`
    ((node, input name) -> values), release `unpersist_tensors`; or, with
    `request_done`, end this partition. Values are the conductor's (tensor
    descriptors, token ids); the hook only routes them."""

    graph_walk: str
    inputs: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    unpersist_tensors: list[Any] = field(default_factory=list)
    request_done: bool = False
    step_metadata: dict[str, Any] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)


class GraphModel:
    """Base class of every Baton model (a plain LLM is `LLMGraphModel`)."""

    # ---- what a model must declare -------------------------------------------------

    def get_node_engine_types(self) -> dict[str, EngineType]:
        raise NotImplementedError(f"{type(self).__name__} must declare get_node_engine_types()")

    def get_graph_walk_graphs(self) -> dict[str, GraphSection]:
        raise NotImplementedError(f"{type(self).__name__} must declare get_graph_walk_graphs()")

    def get_submodule(self, node_name: str, device: str | torch.device = "cpu") -> torch.nn.Module | None:
        """The module that runs stateless node `node_name` (see node_runner for
        its contract). KV-cache nodes run under the engine core: None."""
        raise NotImplementedError(f"{type(self).__name__} has no submodule for node {node_name!r}")

    # ---- kv_cache nodes (run by the engine core over the worker's decoder) ----------

    def get_kv_model_dir(self, node_name: str) -> Path:
        """The Hugging Face decoder directory of kv_cache node `node_name`: a
        worker hosting the node loads it with its KV cache, exactly as it loads
        a plain LLM (same options)."""
        raise NotImplementedError(
            f"{type(self).__name__} does not say where kv_cache node {node_name!r} has its weights "
            "(declare get_kv_model_dir())"
        )

    def get_kv_decoder_layout(self, node_name: str) -> KvDecoderLayout | None:
        """Where a composite directory keeps kv_cache node `node_name`'s decoder
        (its config under a key of config.json, its weights under a prefix), and
        the token whose embeddings prompt embeddings replace. Default: None (the
        directory of get_kv_model_dir is a plain decoder's)."""
        return None

    def get_kv_input_roles(self, node_name: str) -> list[str]:
        """What kv_cache node `node_name`'s prefill inputs after the token ids are, in order, each one of
        KV_INPUT_ROLES: "embeds" (rows replacing the image tokens' embeddings: AddedRequest.embeds),
        "positions" (multimodal rotary positions: AddedRequest.positions), "encoder_states" (an
        encoder's output the decoder cross-attends: AddedRequest.encoder_states). Exported per node as
        `kv_inputs`. Default: embeds, then positions."""
        return ["embeds", "positions"]

    def get_frame_width(self, node_name: str) -> int:
        """A kv_cache node whose every sampled position is a frame of this many ids rather than one token
        (CSM's backbone: the frame's codebooks; StepResult.frames); 0: a token per position."""
        return 0

    def get_stop_token_ids(self, node_name: str) -> list[int]:
        """Token ids that end the loop a kv_cache node's pass is in (the engine
        core's stop checker decides; the sampled stop token is still delivered).
        Exported per node as `stop_token_ids`. Default: none."""
        return []

    # ---- partitions and transitions (defaults: one partition) ---------------------

    def get_partition_topology(self) -> PartitionTopology:
        return PartitionTopology([DEFAULT_PARTITION])

    def get_partitions(self) -> dict[str, set[str]]:
        partitions = self.get_partition_topology().partitions
        if len(partitions) != 1:
            raise GraphDeclarationError(
                f"{type(self).__name__} has partitions {list(partitions)}: declare get_partitions()"
            )
        return {partitions[0]: set(self.get_graph_walk_graphs())}

    def get_walk_transitions(self) -> dict[str, PartitionTransitions]:
        """Default: a partition with one walk runs it once, its inputs taken from
        the prompt values of the same names; a partition fed by a connection
        re-runs its walk for every chunk. Anything else declares its own."""
        graphs = self.get_graph_walk_graphs()
        topology = self.get_partition_topology()
        result: dict[str, PartitionTransitions] = {}
        for partition, walks in self.get_partitions().items():
            if len(walks) != 1:
                raise GraphDeclarationError(
                    f"{type(self).__name__}: partition {partition!r} has walks {sorted(walks)}: "
                    "declare get_walk_transitions()"
                )
            (walk,) = walks
            streamed = {c.edge_name for c in topology.connections if c.to_partition == partition}
            if streamed:
                result[partition] = PartitionTransitions(WalkStep(walk), {walk: WalkStep(walk)})
                continue
            inputs = [
                WalkInput(node, name, "prompt", name) for node, name in _unfed_inputs(graphs[walk])
            ]
            result[partition] = PartitionTransitions(WalkStep(walk, inputs), {walk: WalkStep("")})
        return result

    def get_initial_forward_pass_args(
        self,
        partition_name: str,
        input_modalities: Sequence[str],
        output_modalities: Sequence[str],
        input_signals: Mapping[str, list[Any]],
        model_kwargs: Mapping[str, Any] | None = None,
    ) -> ForwardPassArgs:
        start = self.get_walk_transitions()[partition_name].start
        if start is None:
            return ForwardPassArgs("", request_done=True, kwargs=dict(model_kwargs or {}))
        return _apply_step(start, input_signals, {}, dict(model_kwargs or {}))

    def get_partition_forward_pass_args(
        self,
        partition_name: str,
        partition_metadata: ConductorMetadata,
        persist_signals: Mapping[str, list[Any]],
        incoming_connections: Sequence[Any] | None = None,
    ) -> ForwardPassArgs:
        step = self.get_walk_transitions()[partition_name].after[partition_metadata.graph_walk]
        return _apply_step(
            step, partition_metadata.prompt_signals, persist_signals, partition_metadata.kwargs
        )

    @property
    def python_transitions(self) -> bool:
        """True when the model overrides M*'s transition hooks: the conductor
        must then ask Python at every walk boundary instead of reading data."""
        cls = type(self)
        return (
            cls.get_initial_forward_pass_args is not GraphModel.get_initial_forward_pass_args
            or cls.get_partition_forward_pass_args is not GraphModel.get_partition_forward_pass_args
        )

    # ---- the request's edges to the outside world ---------------------------------

    def process_prompt(
        self,
        prompt: str | None,
        input_modalities: Sequence[str],
        output_modalities: Sequence[str],
        tensors: Mapping[str, list[torch.Tensor]] | None = None,
        **kwargs: Any,
    ) -> dict[str, list[torch.Tensor]]:
        """A request's prompt values by name, at admission. A 1-D integer tensor
        is token ids (returned to the conductor inline); anything else stays in
        the worker as a tensor. Default: the request's tensors as given."""
        return {name: list(values) for name, values in (tensors or {}).items()}

    def postprocess(self, output: torch.Tensor, modality: str, request_kwargs: dict | None = None) -> bytes:
        """Bytes for the client from one tensor of an EMIT_TO_CLIENT edge.
        Default: the tensor's raw bytes in its own dtype (native byte order)."""
        # Through uint8, so dtypes numpy lacks (bfloat16) work too.
        return output.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()

    def get_output_sample_rate(self, modality: str = "audio") -> int | None:
        """Sample rate of audio outputs; None for a model without audio."""
        return None


def _apply_step(
    step: WalkStep,
    prompt_signals: Mapping[str, list[Any]],
    persist_signals: Mapping[str, list[Any]],
    kwargs: dict[str, Any],
) -> ForwardPassArgs:
    if step.done:
        return ForwardPassArgs(
            "",
            unpersist_tensors=[v for name in step.release for v in persist_signals.get(name, [])],
            request_done=True,
            kwargs=kwargs,
        )
    inputs: dict[tuple[str, str], list[Any]] = {}
    for item in step.inputs:
        source = prompt_signals if item.source == "prompt" else persist_signals
        # A missing value arrives as a signal (an empty list), as M*'s empty edges do.
        inputs[(item.node, item.name)] = list(source.get(item.source_name, []))
    return ForwardPassArgs(
        step.walk,
        inputs=inputs,
        unpersist_tensors=[v for name in step.release for v in persist_signals.get(name, [])],
        kwargs=kwargs,
    )


def _unfed_inputs(section: GraphSection) -> list[tuple[str, str]]:
    """(node, input) pairs of a walk that no edge of the walk feeds, in order."""
    fed: set[tuple[str, str]] = set()
    for sec in iter_sections(section):
        if isinstance(sec, GraphNode):
            edges = [e for e in sec.outputs if not e.is_streaming]
        elif isinstance(sec, Loop):
            # Loop outputs leave the loop for later nodes of the walk: they feed too.
            edges = [*sec.outputs, *sec.accumulated_outputs]
        else:
            edges = []
        fed.update((edge.next_node, edge.name) for edge in edges)
    unfed: list[tuple[str, str]] = []
    for node in iter_nodes(section):
        for name in node.input_names:
            pair = (node.name, name)
            if pair not in fed and pair not in unfed:
                unfed.append(pair)
    return unfed
