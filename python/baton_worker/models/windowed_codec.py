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
