"""Rotary position embeddings, computed exactly as transformers does.

inv_freq follows transformers' rope init functions (default, linear, llama3);
cos/sin are computed in float32 and cast to the activation dtype; the
rotation itself (rotate_half, as HF) is layer_ops' rotary().
"""

from __future__ import annotations

import math

import torch

from .config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    dim = int(head_dim * rope.partial_rotary_factor)
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3(inv_freq, rope)
    return inv_freq


def _llama3(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_context_len = rope.original_max_position_embeddings or 8192
    low_freq_wavelen = old_context_len / rope.low_freq_factor
    high_freq_wavelen = old_context_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class Rotary:
    def __init__(self, rope: RopeConfig, head_dim: int, device: torch.device):
        self.inv_freq = inverse_frequencies(rope, head_dim).to(device)
        self.rotary_dim = self.inv_freq.numel() * 2
        self.mrope_section = list(rope.mrope_section) if rope.mrope_section else None
        self.mrope_interleaved = rope.mrope_interleaved
        if self.mrope_section is not None and sum(self.mrope_section) != self.inv_freq.numel():
            raise ValueError(f"mrope_section {self.mrope_section} does not add up to the {self.inv_freq.numel()} rotary frequencies")

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[T, rotary_dim] cos and sin for flat positions [T], or for multimodal positions [3, T]
        (t, h, w streams: frequency band i of mrope_section takes stream i % 3, as transformers'
        Qwen2-VL rotary recomposes them; interleaved, as Qwen3-Omni's does: frequency i takes stream 1 where
        i % 3 == 1 and i < 3 * mrope_section[1], stream 2 where i % 3 == 2 and i < 3 * mrope_section[2],
        stream 0 elsewhere). A text token's three streams are equal, so [T] is its case."""
        if positions.dim() == 1:
            freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        else:
            if self.mrope_section is None:
                raise ValueError("multimodal positions [3, T] for a model without mrope_section")
            streams = positions.to(torch.float32)[:, :, None] * self.inv_freq[None, None, :]  # [3, T, half]
            if self.mrope_interleaved:
                freqs = streams[0].clone()
                for stream in (1, 2):
                    band = slice(stream, 3 * self.mrope_section[stream], 3)
                    freqs[:, band] = streams[stream][:, band]
            else:
                freqs = torch.cat([band[i % 3] for i, band in enumerate(streams.split(self.mrope_section, dim=-1))], dim=-1)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)
