"""What the audio codecs decoded in windows share (CSM's Mimi decoder,
csm/mimi.py; Qwen3-Omni's code2wav, qwen3_omni/code2wav.py): the weights
aligned as transformers' parameters are, and their transformer's rotary
tables, sliding-window mask and attention, computed as transformers' SDPA path
computes them (so float32 results are its bits) for a batch of windows
left-padded to one length. In such a batch (decode_windows) a row's own
positions start at starts[row]; before that it is padding, which no position
of the row attends and every convolution reads as zeros (keep_mask)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..model.layer_ops import rotate_half


def aligned(get: Callable[[str], torch.Tensor]) -> Callable[[str], torch.Tensor]:
    """`get` whose CPU tensors start on a 64-byte boundary (a misaligned safetensors view can make
    oneDNN take other code paths and round differently from transformers' parameters)."""

    def aligned_get(name: str) -> torch.Tensor:
        t = get(name)
        return t.clone() if t.device.type == "cpu" and t.data_ptr() % 64 else t

    return aligned_get


def keep_mask(starts: torch.Tensor, length: int) -> torch.Tensor:
    """[B, 1, length]: True from each row's start on, False before (its padding)."""
    return (torch.arange(length, device=starts.device)[None, :] >= starts[:, None])[:, None, :]


def window_rope(inv_freq: torch.Tensor, steps: int, starts: torch.Tensor | None, dtype: torch.dtype,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [B or 1, 1, steps, head_dim] of positions 0..steps-1, counted from each row's start
    when given; the outer product as a matmul, then cos/sin of [freqs, freqs], as the codecs' rotary
    embeddings compute them."""
    positions = torch.arange(steps, device=device)[None, :, None].float()
    if starts is not None:
        positions = positions - starts[:, None, None].float()
    freqs = (inv_freq[None, :, None].to(device) @ positions.transpose(1, 2)).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def window_mask(steps: int, window: int, starts: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """transformers' sliding-window mask [B or 1, 1, steps, steps] (a query sees the `window` latest
    positions, itself included), or None where it uses SDPA's is_causal (shorter sequences, no padding)."""
    if steps < window and starts is None:
        return None
    i = torch.arange(steps, device=device)
    mask = ((i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window))[None, None]
    if starts is not None:
        # A padding query attends itself alone (a row of nothing but masks would be NaN).
        own = i[None, None, None, :] >= starts[:, None, None, None]
        mask = (mask & own) | (torch.eye(steps, dtype=torch.bool, device=device) & ~own.transpose(-1, -2))
    return mask


def window_attention(h: torch.Tensor, w: dict, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                     heads: int, kv_heads: int, head_dim: int, scaling: float) -> torch.Tensor:
    """Self-attention of h [B, T, hidden] with w["q"], w["k"], w["v"], w["o"] (weight, bias) pairs."""
    b, t, _ = h.shape
    q, k, v = (F.linear(h, *w[n]).view(b, t, -1, head_dim).transpose(1, 2) for n in "qkv")
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    extra = {}
    if heads != kv_heads:
        # transformers lets SDPA broadcast the kv heads when there is no mask (and heads are small enough
        # for its kernels), and repeats them otherwise.
        if mask is None and head_dim <= 256:
            extra["enable_gqa"] = True
        else:
            k, v = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=scaling, is_causal=mask is None and t > 1, **extra)
    return F.linear(out.transpose(1, 2).contiguous().reshape(b, t, -1), *w["o"])


def chunk_policy(left_context_frames: int, chunk: int, max_left_context: int | None) -> tuple[int, int]:
    """(chunk, left_context) in frames for a codec node's LeftContextChunkPolicy: the codec's whole receptive
    field as context (streaming is then exact to float rounding), or max_left_context when that is smaller
    (bounded cost, approximate past it)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1 frame; got {chunk}")
    left = left_context_frames
    if max_left_context is not None:
        if max_left_context < 0:
            raise ValueError(f"max_left_context must be >= 0; got {max_left_context}")
        left = min(left, max_left_context)
    return chunk, left


class WindowedCodecNode(torch.nn.Module):
    """A codec node's submodule (CSM's Mimi, Qwen3-Omni's code2wav): a batch of passes, one chunk of a stream of
    frames each (K integer codes a frame) -> the PCM its new frames add. A chunk's frames up to its first stop
    frame (`is_stop`) form one window, its context frames then its new ones; every window of the batch goes
    through one `codec.decode_windows` call."""

    def __init__(self, codec, width: int, device: torch.device, input_name: str, output_name: str, codec_name: str, code_noun: str):
        super().__init__()
        self.codec, self.width, self.device = codec, width, device
        self.input_name, self.output_name = input_name, output_name
        self.codec_name, self.code_noun = codec_name, code_noun  # for messages: "Mimi's", "codebook"

    def is_stop(self, frames: torch.Tensor) -> torch.Tensor:
        """Per frame [n, K]: whether it ends the audio."""
        raise NotImplementedError

    def prepare_inputs(self, graph_walk: str, info, inputs: dict[str, list[torch.Tensor]]):
        """-> (window codes [K, frames] up to the first stop frame, number of new frames among them)."""
        chunk = info.chunks[self.input_name]
        k = self.width
        # Items come one frame per tensor ([K]); a tensor of several frames ([n, K]) reads the same, in order.
        items = [t[None] if t.dim() == 1 else t for t in inputs.get(self.input_name, [])]
        for t in items:
            if t.dim() != 2 or t.shape[-1] != k or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
                raise ValueError(f"a {self.input_name!r} item must be {k} integer codes per frame; got {t.dtype} {tuple(t.shape)}")
        frames = torch.cat(items).to(self.device, torch.int64) if items else torch.zeros(0, k, dtype=torch.int64, device=self.device)
        if not 0 <= chunk.context_count <= frames.shape[0]:
            raise ValueError(f"chunk {chunk.index} holds {frames.shape[0]} frames but {chunk.context_count} of context")
        stops = self.is_stop(frames).nonzero()
        audio = int(stops[0, 0]) if stops.numel() else frames.shape[0]
        frames = frames[:audio]
        # Checked here, not in the batched decode, so a bad code fails its own request only.
        bad = (frames < 0) | (frames >= self.codec.codebook_size)
        if bool(bad.any()):
            f, q = (int(i) for i in bad.nonzero()[0])
            code, size = int(frames[f, q]), self.codec.codebook_size
            raise ValueError(f"frame {chunk.start + f}, {self.code_noun} {q}: code {code} is outside {self.codec_name} {size}")
        return frames.T, max(0, audio - chunk.context_count)

    def preprocess(self, graph_walk: str, infos, prepared: list):
        return prepared

    def forward(self, graph_walk: str, infos, batch: list) -> list[dict[str, list[torch.Tensor]]]:
        rows = [i for i, (_, new) in enumerate(batch) if new > 0]
        out: list[dict[str, list[torch.Tensor]]] = [{self.output_name: []} for _ in batch]
        if rows:
            # One call for the whole batch: windows of any lengths run as one left-padded batch.
            pcm = self.codec.decode_windows([batch[i][0] for i in rows], [batch[i][1] for i in rows])
            for i, p in zip(rows, pcm):
                out[i] = {self.output_name: [p[0].to(torch.float32)]}
        return out
