"""The graph an encoder feeding a decoder declares: a stateless encoder node
and a kv_cache decoder node, walked `encode` (the encoder: the prompt's media
values -> its output, persisted: held until the request ends, since a
preempted request recomputes its prompt), `prefill` (the decoder: the
prompt's token ids, the encoder's output, and any further prompt values the
model names) and `decode` (the decoder, a loop of one token per iteration).

Vision-language models (vision_language.py: the vision tower's features
replace the image tokens' embeddings) and Whisper (the decoder cross-attends
the audio encoder's output) are this graph; a model names its nodes, the
encoder's output, the encoder's prompt inputs (`encoder_inputs`), further
prefill inputs (`prefill_prompt_inputs`) and the roles of the decoder's
inputs after its token ids (`kv_input_roles`, GraphModel.get_kv_input_roles).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..graph.authoring import EMIT_TO_CLIENT, EMPTY_DESTINATION, EngineType, GraphEdge, GraphNode, GraphSection, Loop
from ..graph.model import DEFAULT_PARTITION, GraphModel, PartitionTransitions, WalkInput, WalkStep
from ..model.weights import WeightReader

TEXT_INPUTS, NEW_TOKEN = "text_inputs", "new_token"
ENCODE, PREFILL, DECODE, DECODE_LOOP = "encode", "prefill", "decode", "decode_loop"


class EncoderDecoderGraph(GraphModel):
    model_dir: Path
    max_model_len: int
    encoder_node: str
    decoder_node: str
    encoder_output: str
    encoder_inputs: tuple[str, ...] = ()
    prefill_prompt_inputs: tuple[str, ...] = ()
    kv_input_roles: tuple[str, ...] = ("embeds", "positions")

    def get_node_engine_types(self) -> dict[str, EngineType]:
        return {self.encoder_node: EngineType.STATELESS, self.decoder_node: EngineType.KV_CACHE}

    def get_kv_input_roles(self, node_name: str) -> list[str]:
        return list(self.kv_input_roles)

    def get_graph_walk_graphs(self) -> dict[str, GraphSection]:
        decoder = self.decoder_node
        encode = GraphNode(self.encoder_node, list(self.encoder_inputs), [GraphEdge(EMPTY_DESTINATION, self.encoder_output, persist=True)])
        prefill = GraphNode(
            decoder,
            [TEXT_INPUTS, self.encoder_output, *self.prefill_prompt_inputs],
            [
                GraphEdge(EMPTY_DESTINATION, NEW_TOKEN, persist=True, conductor_new_token=True),
                GraphEdge(EMIT_TO_CLIENT, NEW_TOKEN, output_modality="text"),
            ],
        )
        decode = Loop(
            GraphNode(decoder, [TEXT_INPUTS], [GraphEdge(decoder, TEXT_INPUTS), GraphEdge(EMIT_TO_CLIENT, NEW_TOKEN, output_modality="text")]),
            max_iters=self.max_model_len,
            name=DECODE_LOOP,
        )
        return {ENCODE: encode, PREFILL: prefill, DECODE: decode}

    def get_partitions(self) -> dict[str, set[str]]:
        return {DEFAULT_PARTITION: {ENCODE, PREFILL, DECODE}}

    def get_walk_transitions(self) -> dict[str, PartitionTransitions]:
        decoder = self.decoder_node
        prefill_inputs = [
            WalkInput(decoder, TEXT_INPUTS, "prompt", TEXT_INPUTS),
            WalkInput(decoder, self.encoder_output, "persist", self.encoder_output),
            *(WalkInput(decoder, name, "prompt", name) for name in self.prefill_prompt_inputs),
        ]
        return {
            DEFAULT_PARTITION: PartitionTransitions(
                start=WalkStep(ENCODE, [WalkInput(self.encoder_node, name, "prompt", name) for name in self.encoder_inputs]),
                after={
                    ENCODE: WalkStep(PREFILL, prefill_inputs),
                    PREFILL: WalkStep(DECODE, [WalkInput(decoder, TEXT_INPUTS, "persist", NEW_TOKEN)], release=[NEW_TOKEN]),
                    DECODE: WalkStep(""),
                },
            )
        }

    def get_kv_model_dir(self, node_name: str) -> Path:
        return self.model_dir

    def get_submodule(self, node_name: str, device: str | torch.device = "cpu") -> torch.nn.Module | None:
        """The encoder node's module, its weights read from the directory (bfloat16 on a GPU); None for the decoder."""
        if node_name == self.decoder_node:
            return None
        if node_name != self.encoder_node:
            raise KeyError(f"{type(self).__name__} has no node {node_name!r}")
        dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
        reader = WeightReader(self.model_dir, dtype, torch.device(device))
        try:
            return self.encoder_submodule(reader, dtype)
        finally:
            reader.close()

    def encoder_submodule(self, reader: WeightReader, dtype: torch.dtype) -> torch.nn.Module:
        raise NotImplementedError
