"""BatonDemoTTS: the demo TTS model declared as a graph (the only file that touches the authoring API).

    partition "llm":   prefill  = llm(text_inputs) -> new_token (persist, new token) + stream to codec
                       decode   = Loop "decode_loop" (max_iters = token cap) of
                                  llm(text_inputs) -> text_inputs (loop-back) + stream to codec
    partition "codec": codec_chunk = codec(new_token) -> audio_chunk (to the client, modality "audio")
    connection llm -> codec on "new_token": SlidingWindowChunkPolicy(window_tokens, stride_tokens)

Transitions (declarative): llm starts with prefill on the prompt's
`text_inputs`, goes to decode with the persisted `new_token` as its
`text_inputs` (released there), and is done after decode (stopped by
end-of-audio, the request's max tokens or max_iters, all token stops decided
by the engine core). codec starts in codec_chunk and stays there, one pass per
chunk, done after the pass that consumed the final chunk.

The `codec` submodule is a CodecNode: one pass per chunk, under the node
runner's submodule contract (prepare_inputs / preprocess / forward(graph_walk,
infos, batch)); it hands each chunk's items and its ChunkInfo (index, start,
context_count, final) to CodecStream (streaming.py), which decodes the batch
and returns each chunk's new PCM; a chunk with no new frame emits nothing. The
`llm` node is the worker's own Llama (KV-cache engine) over the `llm/`
sub-directory, so get_submodule gives None.
Names follow M*'s Orpheus (text_inputs, new_token, decode_loop, audio_chunk).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...graph.authoring import EMIT_TO_CLIENT, EMPTY_DESTINATION, EngineType, GraphEdge, GraphNode, Loop, StreamingGraphEdge
from ...graph.model import GraphModel, PartitionTransitions, WalkInput, WalkStep
from ...graph.streaming import Connection, PartitionTopology, SlidingWindowChunkPolicy
from .audio import pcm_to_s16le
from .spec import DemoTTSSpec
from .streaming import CodecStream, load_codec_stream
from .text import prompt_tensors

LLM = "llm"
CODEC = "codec"


class CodecNode(torch.nn.Module):
    """The `codec` node's submodule: a batch of passes, one chunk of `new_token` each."""

    def __init__(self, stream: CodecStream):
        super().__init__()
        self.stream = stream

    def prepare_inputs(self, graph_walk: str, info, inputs: dict[str, list[torch.Tensor]]):
        # The chunk's ids may come as one tensor or one per item: in order either way.
        items = [t.reshape(-1) for t in inputs.get("new_token", [])]
        tokens = torch.cat(items) if items else torch.zeros(0, dtype=torch.int64)
        return tokens, info.chunks["new_token"]

    def preprocess(self, graph_walk: str, infos, prepared: list):
        return prepared

    def forward(self, graph_walk: str, infos, batch: list) -> list[dict[str, list[torch.Tensor]]]:
        pcm = self.stream([tokens for tokens, _ in batch], [chunk for _, chunk in batch])
        return [{"audio_chunk": [p] if p.numel() else []} for p in pcm]


class BatonDemoTTS(GraphModel):
    def __init__(self, model_dir: str | Path, default_voice: str | None = None):
        """default_voice (a deployment's model_kwargs): the voice of requests that name none."""
        super().__init__()
        self.model_dir = Path(model_dir)
        self.spec = DemoTTSSpec.from_dir(self.model_dir)
        if default_voice is not None and str(default_voice).lower() not in self.spec.tokens.voices:
            raise ValueError(f"default_voice {default_voice!r} is not a voice of this model; valid voices: {', '.join(self.spec.tokens.voices)}")
        self.default_voice = default_voice

    def get_node_engine_types(self) -> dict[str, EngineType]:
        return {LLM: EngineType.KV_CACHE, CODEC: EngineType.STATELESS}

    def get_graph_walk_graphs(self) -> dict:
        def to_codec() -> StreamingGraphEdge:  # a fresh edge per walk: walks share no objects
            return StreamingGraphEdge(next_node=CODEC, name="new_token", target_partition=CODEC)

        prefill = GraphNode(
            LLM,
            input_names=["text_inputs"],
            outputs=[GraphEdge(EMPTY_DESTINATION, "new_token", persist=True, conductor_new_token=True), to_codec()],
        )
        decode = Loop(
            GraphNode(
                LLM,
                input_names=["text_inputs"],
                outputs=[GraphEdge(LLM, "text_inputs"), to_codec()],
            ),
            max_iters=self.spec.max_tokens,
            outputs=[],
            name="decode_loop",
        )
        codec_chunk = GraphNode(
            CODEC,
            input_names=["new_token"],
            outputs=[GraphEdge(EMIT_TO_CLIENT, "audio_chunk", output_modality="audio")],
        )
        return {"prefill": prefill, "decode": decode, "codec_chunk": codec_chunk}

    def get_partition_topology(self) -> PartitionTopology:
        s = self.spec.stream
        return PartitionTopology(
            partitions=[LLM, CODEC],
            connections=[
                Connection(LLM, CODEC, "new_token", lambda: SlidingWindowChunkPolicy(s.window_tokens, s.stride_tokens))
            ],
        )

    def get_partitions(self) -> dict[str, set[str]]:
        return {LLM: {"prefill", "decode"}, CODEC: {"codec_chunk"}}

    def get_walk_transitions(self) -> dict[str, PartitionTransitions]:
        return {
            LLM: PartitionTransitions(
                start=WalkStep("prefill", inputs=[WalkInput(LLM, "text_inputs", "prompt", "text_inputs")]),
                after={
                    "prefill": WalkStep(
                        "decode", inputs=[WalkInput(LLM, "text_inputs", "persist", "new_token")], release=["new_token"]
                    ),
                    "decode": WalkStep(""),
                },
            ),
            CODEC: PartitionTransitions(start=WalkStep("codec_chunk"), after={"codec_chunk": WalkStep("codec_chunk")}),
        }

    def process_prompt(self, prompt, input_modalities, output_modalities, tensors=None, **kwargs):
        """text_inputs = [bos, voice, UTF-8 bytes of the prompt..., start_of_speech]; kwargs["voice"] picks the voice."""
        voice = kwargs.get("voice")
        return prompt_tensors(prompt or "", self.default_voice if voice is None else voice, self.spec.tokens)

    def postprocess(self, output: torch.Tensor, modality: str, request_kwargs: dict | None = None) -> bytes:
        if modality != "audio":
            raise ValueError(f"BatonDemoTTS emits audio only, not {modality!r}")
        return pcm_to_s16le(output)

    def get_submodule(self, node_name: str, device: torch.device | str = "cpu") -> torch.nn.Module | None:
        if node_name == CODEC:
            return CodecNode(load_codec_stream(self.model_dir, device))
        if node_name == LLM:
            return None
        raise ValueError(f"unknown node {node_name!r}")

    def get_kv_model_dir(self, node_name: str) -> Path:
        if node_name != LLM:
            raise ValueError(f"node {node_name!r} is not a kv_cache node of BatonDemoTTS")
        return self.model_dir / self.spec.llm_dir

    def get_stop_token_ids(self, node_name: str) -> list[int]:
        # end-of-audio ends decode_loop; its iteration still streams it to the codec, which ignores it.
        return [self.spec.tokens.end_of_audio] if node_name == LLM else []

    def get_output_sample_rate(self, modality: str = "audio") -> int:
        return self.spec.sample_rate

    def get_voices(self) -> list[str]:
        return list(self.spec.tokens.voices)
