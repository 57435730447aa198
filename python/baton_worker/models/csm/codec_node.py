"""CSM's `codec` node: Mimi's decoder over the backbone's stream of frames, one pass per chunk.

The stream. Each backbone step appends one item to the `frames` stream: a
tensor of K int ids, the K codebook codes of one audio frame (80 ms, 1920
samples at 24 kHz). When a request stops naturally its last item is the stop
frame, all K codes equal to codebook_eos_token_id (0); transformers'
generate cuts the audio at the first all-eos frame
(`(codes == eos).all(-1)`), so that frame, and anything after it, is never
decoded. (The backbone stops on codebooks 0..K-2 being eos; a stop frame whose
last code is not eos is decoded by transformers, and so it is here.) A request
stopped by its frame cap has no stop frame.

The chunks. The connection's policy is LeftContextChunkPolicy(C, L)
(docs/graph-semantics.md, "Streaming connections"): chunk k holds items
[max(0, k*C - L), (k+1)*C), of which the first context_count = min(k*C, L)
were in earlier chunks; once the backbone is done with n items, the first chunk
reaching past n is final and holds [start, n): fewer than C new items, or
none (only context, or nothing at all for n = 0).

A pass. A chunk's frames up to its first stop frame form one window, the
chunk's context frames then its new ones; the window is decoded with
MimiDecoder.decode_window and the PCM of the new frames is emitted
(`audio_chunk`: float32 [new * 1920], or nothing when the chunk brings no new
audio frame). All passes of a batch go through one decode_windows call, which
runs windows of equal shape (every request in its steady state: L + C frames)
as one batch. Each frame is new in exactly one chunk, so a request's chunks
concatenate to its whole audio, once, in order.

Left context: exact, or bounded cost. Every layer of Mimi's decoder is causal
with a bounded reach, so a frame's samples depend on exactly
`left_context_frames` frames before it: the transformer's layers reach
sliding_window - 1 positions (at 25 Hz) back each, plus the SEANet convs and
the upsample. With L >= left_context_frames a window decode gives the whole
decode's samples up to float32 rounding (different lengths sum in different
orders); with less, the attention misses frames it would have seen.
Measured on the tests' random CSM codec (1 layer, window 250:
left_context_frames = 130), emitting 4 new frames at the end of a 400-frame
stream, max |window - whole| over 11 windows:

    L      0     8      32     64     96      128     129     130
    diff   1.25  0.037  0.023  0.015  0.0062  5.3e-4  1.1e-4  8.3e-7
    s16    40888 1222   746    501    204     18      3       1

Random weights attend almost uniformly over the window, so nothing short of
the whole field stays within 1 s16 LSB; a trained Mimi's attention is more
local, but no bound short of the field is guaranteed. So the default is the
exact field: codec_chunk_policy gives (DEFAULT_CHUNK_FRAMES, left_context_frames). Transformers'
own decode of a prefix already differs from its whole decode by ~7e-7 (1 LSB
in places), so that is the best any streaming decode can match.

The cost, for sesame/csm-1b's codec (8 layers, window 250: 1001 frames, 80 s).
Per frame the upsample + transformer take about 0.11 GFLOP and the SEANet
about 0.35 GFLOP. A chunk's window holds the whole stream so far until it is
80 s long, and csm-1b generates at most 125 frames (10 s) by default, so in
practice every chunk re-runs the transformer over everything generated so far:
about n^2 / (2C) frame-passes per request (~2100 for 10 s at C = 4 against 125
for one whole decode). The SEANet runs only over the new frames and 8
positions of context, so 10 s of audio cost about 0.28 TFLOP streamed against
0.06 TFLOP for one whole decode (~5x), and a steady-state chunk beyond 80 s
about 0.11 TFLOP (milliseconds on an H100). A deployment that wants less can
pass max_left_context (e.g. 250 frames, 20 s: at most ~28 GFLOP a chunk) and
accept that requests longer than that are decoded approximately.

Chunk size: C = 8 frames (640 ms of audio) gives the first audio after eight
backbone steps; a smaller C lowers that latency but runs the transformer over
the context, and the SEANet over its 8 positions of context, once per C
frames, so cost rises as 1/C. On the demo directory (2-core CPU, c=8, the codec
on its own worker) C = 4 cost the codec's worker 10.4 CPU-seconds where C = 8
cost 8.2 for the same 550 requests, and the first audio stayed under 100 ms.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...model.weights import WeightReader
from ..windowed_codec import WindowedCodecNode, chunk_policy
from .mimi import MimiDecoder, receptive_field

INPUT = "frames"
OUTPUT = "audio_chunk"
DEFAULT_CHUNK_FRAMES = 8  # 640 ms of audio per chunk


def codec_chunk_policy(
    decoder: MimiDecoder | dict, chunk: int = DEFAULT_CHUNK_FRAMES, max_left_context: int | None = None
) -> tuple[int, int]:
    """(chunk, left_context) for the backbone -> codec LeftContextChunkPolicy, in frames (windowed_codec
    chunk_policy: Mimi's whole receptive field, or max_left_context when smaller; see the module docstring).
    decoder: a MimiDecoder, or the CSM (or Mimi) config.json dict, so a graph can declare its connection
    without loading weights."""
    left = receptive_field(decoder)[0] if isinstance(decoder, dict) else decoder.left_context_frames
    return chunk_policy(left, chunk, max_left_context)


def _decoder_device(decoder: MimiDecoder) -> torch.device:
    # MimiDecoder keeps its weights as plain tensors (not parameters); the first SEANet conv's tells where they are.
    return decoder.seanet[0][1].device


class CsmCodecNode(WindowedCodecNode):
    """The `codec` node's submodule: a batch of passes, one chunk of `frames` each -> `audio_chunk` PCM."""

    def __init__(self, decoder: MimiDecoder, eos: int = 0):
        if decoder.audio_channels != 1:
            raise ValueError(f"CSM's codec emits mono audio; this Mimi has {decoder.audio_channels} channels")
        super().__init__(decoder, decoder.num_codebooks, _decoder_device(decoder), INPUT, OUTPUT, "Mimi's", "codebook")
        self.eos = int(eos)

    def is_stop(self, frames: torch.Tensor) -> torch.Tensor:
        # transformers decodes up to the first all-eos frame; the backbone's stop frame is its last item.
        return (frames == self.eos).all(dim=-1)


def load_codec_node(model_dir: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> CsmCodecNode:
    """The codec node's submodule for a CSM directory (config.json's codec_config, `codec_model.*` weights)."""
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    decoder = MimiDecoder(WeightReader(model_dir, dtype, torch.device(device)).get, config)
    return CsmCodecNode(decoder, eos=int(config.get("codebook_eos_token_id", 0)))
