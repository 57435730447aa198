"""Qwen3-Omni's `code2wav` node: code2wav (code2wav.py) over the talker's stream of frames, one pass per
chunk, as CSM's codec node runs Mimi (models/csm/codec_node.py).

The stream. Each talker step appends one item to the `codes` stream: a tensor of G int codes (G =
num_code_groups = code2wav's num_quantizers), one frame of audio (80 ms, 1920 samples at 24 kHz). When
the talker stops on codec_eos its last item is the stop frame (codec_eos in every group,
talker_steps.py): transformers hands code2wav only the frames before the codec_eos draw, so that frame,
and anything after it, is never decoded (a frame whose codebook 0 is codec_eos ends the stream). A
request stopped by its max tokens has no stop frame.

The chunks. The connection's policy is LeftContextChunkPolicy(C, L) (docs/graph-semantics.md,
"Streaming connections"): chunk k holds items [max(0, k*C - L), (k+1)*C), of which the first
context_count = min(k*C, L) were in earlier chunks; once the talker is done with n items, the first
chunk reaching past n is final and holds [start, n): fewer than C new items, or none.

A pass. A chunk's frames up to its first stop frame form one window, its context frames then its new
ones; the pass emits the samples its new frames add (`audio_chunk`: float32, nothing when the chunk
brings no new frame): Code2Wav.decode_window's samples, C * 1920 a chunk, fewer for the stream's first
chunk, which starts at frame 0 (a whole decode of n frames has n * 1920 - 555 samples: the transposed
convs trim their first samples). All passes of a batch go through one decode_windows call (windows of
every length in one batch, left-padded). Each frame is new in exactly one chunk, so a request's chunks
concatenate to code2wav's whole-sequence decode of its frames, to float32 rounding, once L is the
whole receptive field.

Left context. Every layer of code2wav is causal with a bounded reach: a frame's samples depend on
exactly left_context_frames frames before it (code2wav.receptive_field: each pre-transformer layer's
sliding_window - 1 frames, plus the convolutions' 10; 578 frames, 46 s, for Qwen3-Omni's 8 layers of
window 72). code2wav_chunk_policy's default L is that field, so streaming is exact. transformers' own
chunked_decode uses 25 frames of context (chunks of 300): its audio differs from the whole decode past
the first 300 frames (and at each chunk boundary loses the 555 trimmed samples); this node follows the
whole decode instead.

The cost, for Qwen3-Omni's code2wav (216 M parameters: hidden 1024, 8 layers; decoder_dim 1536), counted
with torch's FlopCounterMode: per frame about 0.22 GFLOP in the transformer and 4.9 GFLOP in the
upsampling and decoder. A chunk runs the transformer over its whole window (the stream so far, up to
L + C frames) and the convolutions over its C new frames and 10 frames of context: 10 s of speech (125
frames) streamed at C = 8 costs 1.56 TFLOP against 0.64 for one whole decode (2.4x, mostly the
convolutions' context), and a steady-state chunk past 46 s 0.23 TFLOP. max_left_context bounds the
transformer's share, approximately past it.

Chunk size: C = 8 frames (640 ms of audio) gives the first audio after eight talker steps; a smaller C
lowers that latency, and each chunk re-runs the convolutions over 10 frames of context, so their cost
rises as (C + 10) / C.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...model.weights import WeightReader
from ..windowed_codec import WindowedCodecNode, chunk_policy
from .code2wav import Code2Wav, receptive_field

INPUT = "codes"
OUTPUT = "audio_chunk"
DEFAULT_CHUNK_FRAMES = 8  # 640 ms of audio per chunk


def code2wav_chunk_policy(code2wav: Code2Wav | dict, chunk: int = DEFAULT_CHUNK_FRAMES,
                          max_left_context: int | None = None) -> tuple[int, int]:
    """(chunk, left_context) in frames for the talker -> code2wav LeftContextChunkPolicy (windowed_codec
    chunk_policy: code2wav's whole receptive field, or max_left_context when smaller). code2wav: a Code2Wav,
    or Qwen3-Omni's config.json dict (or its code2wav_config), so a graph can declare its connection without
    loading weights."""
    left = code2wav.left_context_frames if isinstance(code2wav, Code2Wav) else receptive_field(code2wav)[0]
    return chunk_policy(left, chunk, max_left_context)


class Code2WavNode(WindowedCodecNode):
    """The `code2wav` node's submodule: a batch of passes, one chunk of `codes` each -> `audio_chunk` PCM."""

    def __init__(self, code2wav: Code2Wav, codec_eos: int):
        super().__init__(code2wav, code2wav.num_quantizers, code2wav.embedding.device, INPUT, OUTPUT, "code2wav's", "group")
        self.codec_eos = int(codec_eos)

    def is_stop(self, frames: torch.Tensor) -> torch.Tensor:
        # The talker's stop frame (codebook 0 codec_eos) ends the stream; transformers decodes the frames before it.
        return frames[:, 0] == self.codec_eos


def load_code2wav_node(model_dir: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> Code2WavNode:
    """The code2wav node's submodule for a Qwen3-Omni directory (config.json's code2wav_config, `code2wav.*`
    weights; codec_eos from talker_config)."""
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    reader = WeightReader(model_dir, dtype, torch.device(device))
    try:
        code2wav = Code2Wav(reader.get, config)
    finally:
        reader.close()
    talker = config.get("talker_config") or {}
    groups = int(talker.get("num_code_groups", code2wav.num_quantizers))
    if groups != code2wav.num_quantizers:
        raise ValueError(f"the talker makes frames of {groups} codes but code2wav decodes {code2wav.num_quantizers} quantizers")
    return Code2WavNode(code2wav, int(talker.get("codec_eos_token_id", 4198)))
