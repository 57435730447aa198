"""The plain LLM as a graph: one KV-cache node `llm`, walks `prefill` and `decode`.

Every Hugging Face LLM directory serves as this model; there is no second code
path for text-only models. The engine core runs the `llm` node (scheduler,
block manager, prefix cache, the worker's decoder), so it has no Python
submodule here, and its loop-back is carried by the engine core feeding each
sampled token back. Token stops (EOS, stop ids, max tokens) end `decode_loop`;
`max_iters` is only the model's length limit. The worker builds this model
itself for a plain LLM directory (no registry entry, no get_kv_model_dir: the
directory is the decoder's).
"""

from __future__ import annotations

import torch

from .authoring import EMIT_TO_CLIENT, EMPTY_DESTINATION, EngineType, GraphEdge, GraphNode, GraphSection, Loop
from .model import DEFAULT_PARTITION, GraphModel, PartitionTransitions, WalkInput, WalkStep

LLM_NODE = "llm"
PREFILL_WALK = "prefill"
DECODE_WALK = "decode"
DECODE_LOOP = "decode_loop"
TEXT_INPUTS = "text_inputs"
NEW_TOKEN = "new_token"
# The nodes and their engines, known before the decoder is loaded (a worker checks --nodes against them).
NODE_ENGINES = {LLM_NODE: EngineType.KV_CACHE}


class LLMGraphModel(GraphModel):
    def __init__(self, max_model_len: int, node: str = LLM_NODE) -> None:
        """node: the KV-cache node's name (a composite model's text-only graph names its decoder, e.g. thinker)."""
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1:
            raise ValueError(f"max_model_len must be a positive int, got {max_model_len!r}")
        self.max_model_len = max_model_len
        self.node = node

    def get_node_engine_types(self) -> dict[str, EngineType]:
        return {self.node: EngineType.KV_CACHE}

    # get_stop_token_ids: the default (none). The frontend adds the tokenizer's
    # EOS ids and the request's stop ids itself, as it always has for a plain LLM.

    def get_graph_walk_graphs(self) -> dict[str, GraphSection]:
        prefill = GraphNode(
            self.node,
            [TEXT_INPUTS],
            [
                # The first sampled token goes to the conductor, which starts decode with it.
                GraphEdge(EMPTY_DESTINATION, NEW_TOKEN, persist=True, conductor_new_token=True),
                GraphEdge(EMIT_TO_CLIENT, NEW_TOKEN, output_modality="text"),
            ],
        )
        decode = Loop(
            GraphNode(
                self.node,
                [TEXT_INPUTS],
                [
                    GraphEdge(self.node, TEXT_INPUTS),
                    GraphEdge(EMIT_TO_CLIENT, NEW_TOKEN, output_modality="text"),
                ],
            ),
            max_iters=self.max_model_len,
            name=DECODE_LOOP,
        )
        return {PREFILL_WALK: prefill, DECODE_WALK: decode}

    def get_partitions(self) -> dict[str, set[str]]:
        return {DEFAULT_PARTITION: {PREFILL_WALK, DECODE_WALK}}

    def get_walk_transitions(self) -> dict[str, PartitionTransitions]:
        return {
            DEFAULT_PARTITION: PartitionTransitions(
                start=WalkStep(PREFILL_WALK, [WalkInput(self.node, TEXT_INPUTS, "prompt", TEXT_INPUTS)]),
                after={
                    PREFILL_WALK: WalkStep(
                        DECODE_WALK,
                        [WalkInput(self.node, TEXT_INPUTS, "persist", NEW_TOKEN)],
                        release=[NEW_TOKEN],
                    ),
                    DECODE_WALK: WalkStep(""),
                },
            )
        }

    def get_submodule(self, node_name: str, device: str | torch.device = "cpu") -> torch.nn.Module | None:
        if node_name != self.node:
            raise KeyError(f"the LLM graph has no node {node_name!r}")
        return None  # the engine core runs it
