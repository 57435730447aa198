"""Sesame's CSM (CsmForConditionalGeneration) as a graph: text to speech.

    partition "backbone": prefill = backbone(text_inputs, prompt_frames) -> frames (persist) + stream to codec
                          decode  = Loop "decode_loop" of backbone(text_inputs) -> text_inputs (loop-back)
                                    + stream to codec
    partition "codec":    codec_chunk = codec(frames) -> audio_chunk (to the client, 24 kHz PCM as s16le)
    connection backbone -> codec on "frames": LeftContextChunkPolicy(chunk, left_context)

The `backbone` node is a kv_cache node whose every step yields one audio frame
per request: the backbone's codebook 0, then the depth decoder's other
codebooks, run inside the same worker step for every sampled row at once
(steps.py). The depth decoder is not a node of its own: its inner loop of K-1
forwards per frame would be K-1 round trips through the control plane per
frame, and it only ever reads the backbone's last hidden row, so it runs where
that row is (the worker's StepRunner), batched over the step's frames.

The engine sees codebook 0 (or the stop id, <|audio_eos|>, for the all-zero
stop frame) as the token and the whole frame beside it; the conductor streams
frames (K ids each) to the codec node, whose chunks decode with the left
context Mimi needs (codec_node.py) into PCM. The stop frame is streamed and
never decoded, as transformers cuts the audio at it.

process_prompt builds the processor's prompt (prompt.py): the text as the
speaker's turn, after any context turns (voice prompting: a reference clip and
its transcript, encoded to frames by Mimi's encoder), as token ids for the
engine (`text_inputs`) and frames for the worker (`prompt_frames`,
AddedRequest.embeds).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...graph.authoring import EMIT_TO_CLIENT, EMPTY_DESTINATION, EngineType, GraphEdge, GraphNode, Loop, StreamingGraphEdge
from ...graph.model import GraphModel, KvDecoderLayout, PartitionTransitions, WalkInput, WalkStep
from ...graph.streaming import Connection, LeftContextChunkPolicy, PartitionTopology
from ...model.config import read_json
from ..demo_tts.audio import pcm_to_s16le
from .codec_node import codec_chunk_policy, load_codec_node
from .prompt import ContextTurn, CsmPrompter
from .steps import CsmFrames, make_step_model, read_config

BACKBONE = "backbone"
CODEC = "codec"
FRAMES = "frames"
ARCHITECTURE = "CsmForConditionalGeneration"
# Frames a request may generate when it names no max_tokens: csm-1b's generation_config max_length
# is in frames of audio at 12.5 Hz (about 2.6 minutes), but a request this long is a mistake.
DEFAULT_MAX_FRAMES = 1024


class CsmGraphModel(GraphModel):
    def __init__(self, model_dir: str | Path):
        super().__init__()
        self.model_dir = Path(model_dir)
        self.config = read_json(self.model_dir / "config.json")
        codec = self.config.get("codec_config") or {}
        self.sample_rate = int(codec.get("sampling_rate", 24_000))
        self.num_codebooks = int(self.config.get("num_codebooks", 32))
        self.stop_token_id = int(self.config.get("audio_eos_token_id", 128003))
        self._prompter: CsmPrompter | None = None
        self._chunk_policy: tuple[int, int] | None = None

    # -- the graph ----------------------------------------------------------------------

    def get_node_engine_types(self) -> dict[str, EngineType]:
        return {BACKBONE: EngineType.KV_CACHE, CODEC: EngineType.STATELESS}

    def get_graph_walk_graphs(self) -> dict:
        def to_codec() -> StreamingGraphEdge:
            return StreamingGraphEdge(next_node=CODEC, name=FRAMES, target_partition=CODEC)

        prefill = GraphNode(
            BACKBONE,
            input_names=["text_inputs", "prompt_frames"],
            outputs=[GraphEdge(EMPTY_DESTINATION, FRAMES, persist=True, conductor_new_token=True), to_codec()],
        )
        decode = Loop(
            GraphNode(BACKBONE, input_names=["text_inputs"], outputs=[GraphEdge(BACKBONE, "text_inputs"), to_codec()]),
            max_iters=DEFAULT_MAX_FRAMES,
            outputs=[],
            name="decode_loop",
        )
        codec_chunk = GraphNode(CODEC, input_names=[FRAMES], outputs=[GraphEdge(EMIT_TO_CLIENT, "audio_chunk", output_modality="audio")])
        return {"prefill": prefill, "decode": decode, "codec_chunk": codec_chunk}

    def get_partition_topology(self) -> PartitionTopology:
        chunk, left = self._policy()
        return PartitionTopology(
            partitions=[BACKBONE, CODEC],
            connections=[Connection(BACKBONE, CODEC, FRAMES, lambda: LeftContextChunkPolicy(chunk, left))],
        )

    def get_partitions(self) -> dict[str, set[str]]:
        return {BACKBONE: {"prefill", "decode"}, CODEC: {"codec_chunk"}}

    def get_walk_transitions(self) -> dict[str, PartitionTransitions]:
        return {
            BACKBONE: PartitionTransitions(
                start=WalkStep(
                    "prefill",
                    inputs=[WalkInput(BACKBONE, "text_inputs", "prompt", "text_inputs"),
                            WalkInput(BACKBONE, "prompt_frames", "prompt", "prompt_frames")],
                ),
                after={
                    "prefill": WalkStep("decode", inputs=[WalkInput(BACKBONE, "text_inputs", "persist", FRAMES)], release=[FRAMES]),
                    "decode": WalkStep(""),
                },
            ),
            CODEC: PartitionTransitions(start=WalkStep("codec_chunk"), after={"codec_chunk": WalkStep("codec_chunk")}),
        }

    def _policy(self) -> tuple[int, int]:
        """(chunk, left_context) in frames: small chunks for the first audio, and the codec's whole receptive
        field as context, so every chunk's samples are those of one decode of all frames (to rounding)."""
        if self._chunk_policy is None:
            self._chunk_policy = codec_chunk_policy(self.config)
        return self._chunk_policy

    # -- the kv_cache node ----------------------------------------------------------------

    def get_kv_model_dir(self, node_name: str) -> Path:
        if node_name != BACKBONE:
            raise ValueError(f"node {node_name!r} is not a kv_cache node of CSM")
        return self.model_dir

    def get_kv_decoder_layout(self, node_name: str) -> KvDecoderLayout:
        # The worker loading the backbone is the one prompts go to (rank 0 in the usual placements): its
        # processor and Mimi encoder load now, not on the first request.
        self._prompter = self._prompter or CsmPrompter(self.model_dir)
        stop = self.stop_token_id
        return KvDecoderLayout(
            None,
            lambda name: name,
            read_config=read_config,
            make_decoder=make_step_model(self.model_dir),
            frames=lambda model_dir, model: CsmFrames(model, stop),
        )

    def get_kv_input_roles(self, node_name: str) -> list[str]:
        return ["embeds"]

    def get_frame_width(self, node_name: str) -> int:
        return self.num_codebooks if node_name == BACKBONE else 0

    def get_stop_token_ids(self, node_name: str) -> list[int]:
        return [self.stop_token_id] if node_name == BACKBONE else []

    # -- requests -------------------------------------------------------------------------

    def process_prompt(self, prompt, input_modalities, output_modalities, tensors=None, **kwargs):
        """kwargs: voice (the speaker id, "0" when none), and for voice prompting context_audio (a list of
        clips' bytes), context_text (their transcripts) and context_voice (their speakers; the request's
        speaker when absent)."""
        if self._prompter is None:
            self._prompter = CsmPrompter(self.model_dir)
        speaker = str(kwargs.get("voice") if kwargs.get("voice") is not None else "0")
        audio = list(kwargs.get("context_audio") or [])
        texts = list(kwargs.get("context_text") or [])
        voices = list(kwargs.get("context_voice") or [])
        if len(texts) != len(audio):
            raise ValueError(f"context_text: {len(texts)} transcripts for {len(audio)} reference clips (one each)")
        # Each turn is named by the form part it came from (/generate's files, in order).
        context = [ContextTurn(str(t), str(voices[i]) if i < len(voices) else speaker, bytes(a), f"files[{i}]")
                   for i, (t, a) in enumerate(zip(texts, audio))]
        built = self._prompter.build(prompt or "", speaker, context)
        return {"text_inputs": torch.from_numpy(built.input_ids.astype("int64")), "prompt_frames": built.frames}

    def postprocess(self, output: torch.Tensor, modality: str, request_kwargs: dict | None = None) -> bytes:
        if modality != "audio":
            raise ValueError(f"CSM emits audio only, not {modality!r}")
        return pcm_to_s16le(output)

    def get_submodule(self, node_name: str, device: torch.device | str = "cpu") -> torch.nn.Module | None:
        if node_name == CODEC:
            return load_codec_node(self.model_dir, device)
        if node_name == BACKBONE:
            return None
        raise ValueError(f"unknown node {node_name!r}")

    def get_output_sample_rate(self, modality: str = "audio") -> int:
        return self.sample_rate
