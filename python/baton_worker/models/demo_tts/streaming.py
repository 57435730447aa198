"""Window arithmetic of the llm -> codec stream, and the codec node that uses it.

The stream. Every token the LLM samples (prefill's and each decode
iteration's `new_token`) is one item, in order: item i is the i-th generated
token. When end-of-audio stops the loop, its iteration still delivers its
token (docs/graph-semantics.md, "Stops"), so end-of-audio is the last item;
when the token cap stops it, the last item is an ordinary token.

Frames. With F = codes_per_frame tokens per frame, frame k is items
[k*F, (k+1)*F). Every item maps to a code, code = (token - audio_offset) mod
codebook_size: for an audio token the code it names (whatever position it
names); text and special tokens, which the random LLM sometimes samples, get
some code too rather than being skipped (skipping would move every later
frame boundary). Only end-of-audio is not audio: a frame holding
it, or lying after it, is incomplete. A frame is audio iff all its F items
arrived before any end-of-audio; a trailing partial frame (cap not a multiple
of F, or end-of-audio in mid-frame) is dropped, never padded.

The chunks. The connection's policy is SlidingWindowChunkPolicy(W, S) with W
a multiple of F and S = F. Each chunk carries (docs/graph-semantics.md,
"Streaming connections") its index, start offset s (item index of its first
item), its number of context items c (leading items an earlier chunk already
held) and a final flag; its items are [s, s+L) and the new ones [s+c, s+L). For N items
the policy yields the full windows [i*S, i*S+W) for i = 0..j, the largest j
with j*S+W <= N (c = 0 for the first, W-S after), then one final chunk:
- N < W (no full window): [0, N) with c = 0, all new; N = 0 gives one empty
  final chunk;
- otherwise the retained tail [(j+1)*S, N) with c = W-S: its new items
  [j*S+W, N) number N-j*S-W < S, none when N = j*S+W (then it holds only
  context). A runtime may send that tail empty instead; see below.

What a chunk decodes and emits. The codec decodes the audio frames lying
wholly inside the chunk, frames ceil(s/F) .. floor((s+a)/F)-1 where a is the
number of the chunk's items before an end-of-audio (a = L without one), as one
window, and emits the PCM of the frames among them whose last item is new in
this chunk: frame k with (k+1)*F-1 >= s+c, i.e. k >= floor((s+c)/F). Each
item is new in exactly one chunk and S = F keeps every start on a frame
boundary, so every audio frame is emitted exactly once, in order, and the
concatenation of all chunks' PCM is frames 0, 1, 2, ... each once:
- chunk 0 (a full window) emits frames 0..W/F-1 (4 frames for W = 16);
- full window i >= 1 emits frame i+W/F-1, decoded with W/F-1 frames of left context;
- the final chunk emits frames only when N < W (then it is [0, N), all new);
  otherwise its new items, fewer than S = F, never complete a frame, so it
  emits nothing and what context it holds does not matter (an empty final
  chunk gives the same bytes).
Whether the runtime streams the stopping end-of-audio or not gives the same
PCM: that item only ever lies in a frame that is dropped anyway.
Audio frames = floor(n / F) where n is the number of items before end-of-audio.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from .codec import CodecDecoder, load_codec
from .spec import DemoTTSSpec


@dataclass(frozen=True)
class StreamChunk:
    """The metadata the runtime gives with every chunk.

    docs/graph-semantics.md, "Streaming connections", says what each field
    means. Same fields as the graph runtime's ChunkInfo, so either can be passed.
    """

    index: int
    start: int  # stream offset of the chunk's first item
    context_count: int  # leading items already held by an earlier chunk
    final: bool


@dataclass(frozen=True)
class FrameSpan:
    """Frames a chunk decodes ([first, first+count)) and, among them, those it emits."""

    first: int
    count: int
    first_new: int  # absolute frame index of the first emitted frame
    new_count: int


def sliding_window_chunks(num_items: int, window: int, stride: int) -> list[tuple[StreamChunk, int]]:
    """The chunks SlidingWindowChunkPolicy(window, stride) yields for num_items items, as (chunk, length)."""
    if window < 1 or not 1 <= stride <= window:
        raise ValueError("need window >= stride >= 1")
    chunks: list[tuple[StreamChunk, int]] = []
    start = 0
    while start + window <= num_items:
        context = 0 if not chunks else window - stride
        chunks.append((StreamChunk(len(chunks), start, context, False), window))
        start += stride
    if not chunks:
        chunks.append((StreamChunk(0, 0, 0, True), num_items))
    else:
        chunks.append((StreamChunk(len(chunks), start, window - stride, True), num_items - start))
    return chunks


def chunk_frames(chunk: StreamChunk, audio_items: int, tokens_per_frame: int) -> FrameSpan:
    """Frames decoded and emitted for a chunk whose first `audio_items` items precede any end-of-audio."""
    f = tokens_per_frame
    first = -(-chunk.start // f)
    end = (chunk.start + audio_items) // f
    count = max(0, end - first)
    first_new = max(first, (chunk.start + chunk.context_count) // f)
    return FrameSpan(first, count, first_new, max(0, end - first_new))


class CodecStream(nn.Module):
    """The `codec` node's submodule: decodes a batch of chunks of the llm's token stream.

    forward(tokens, chunks): tokens[i] is chunk i's items (int ids, 1-D, in
    stream order) and chunks[i] its metadata; returns one float32 1-D PCM
    tensor per chunk, new_count * samples_per_frame samples (possibly none).
    Chunks with the same number of decoded frames run as one batch of the
    decoder (every full window has W/F frames).
    """

    def __init__(self, spec: DemoTTSSpec, decoder: CodecDecoder):
        super().__init__()
        self.spec = spec
        self.decoder = decoder

    def codes_of(self, items: torch.Tensor) -> torch.Tensor:
        t = self.spec.tokens
        return torch.remainder(items.to(torch.int64) - t.audio_offset, t.codebook_size)

    def spans(self, tokens: list[torch.Tensor], chunks: list[StreamChunk]) -> list[FrameSpan]:
        eoa = self.spec.tokens.end_of_audio
        spans = []
        for items, chunk in zip(tokens, chunks, strict=True):
            stops = (items == eoa).nonzero()
            audio_items = int(stops[0, 0]) if stops.numel() else items.numel()
            spans.append(chunk_frames(chunk, audio_items, self.spec.tokens_per_frame))
        return spans

    @torch.inference_mode()
    def forward(self, tokens: list[torch.Tensor], chunks: list[StreamChunk]) -> list[torch.Tensor]:
        f = self.spec.tokens_per_frame
        spf = self.spec.codec.samples_per_frame
        device = self.decoder.position_offsets.device
        spans = self.spans(tokens, chunks)
        out = [torch.zeros(0, dtype=torch.float32, device=device) for _ in chunks]
        by_count: dict[int, list[int]] = {}
        for i, span in enumerate(spans):
            if span.new_count > 0:
                by_count.setdefault(span.count, []).append(i)
        for count, rows in by_count.items():
            codes = []
            for i in rows:
                lo = spans[i].first * f - chunks[i].start
                codes.append(self.codes_of(tokens[i][lo : lo + count * f].to(device)).reshape(count, f))
            pcm = self.decoder(torch.stack(codes))
            for row, i in enumerate(rows):
                skip = spans[i].first_new - spans[i].first
                out[i] = pcm[row, skip * spf : (skip + spans[i].new_count) * spf]
        return out


def load_codec_stream(model_dir: str | Path, device: torch.device | str = "cpu") -> CodecStream:
    """The codec node's submodule for a built model directory."""
    spec = DemoTTSSpec.from_dir(model_dir)
    weights = load_file(str(Path(model_dir) / spec.codec_weights))
    return CodecStream(spec, load_codec(spec.codec, weights, device))
