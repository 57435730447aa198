"""Whisper's audio encoder (transformers' WhisperEncoder) in plain PyTorch:
log-mel features [batch, mels, 3000] -> hidden states [batch, 1500, d_model],
every clip of a step in one forward.

  1. two Conv1d (kernel 3, padding 1; the second with stride 2, halving 3000
     frames to 1500), each followed by exact GELU;
  2. plus embed_positions (a fixed sinusoid table, stored in the checkpoint);
  3. pre-LayerNorm layers: self-attention whose k projection has no bias (q, v
     and out do), then fc1 -> activation -> fc2, each with a residual;
  4. a final LayerNorm.

Every clip is exactly 30 s of features (shorter audio is padded with silence
by features.py, as transformers does), so the batch needs no mask and no
clip sees another. Queries are scaled by head_dim ** -0.5 before q @ k, as
transformers and openai/whisper do (not inside the attention call): the order
of rounding is part of matching them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..llava.vision import activation

# WhisperForConditionalGeneration's names (openai/whisper-* and transformers 5's save_pretrained alike).
ENCODER_PREFIX = "model.encoder."
# nn.LayerNorm's default; Whisper's config has no field for it.
LAYER_NORM_EPS = 1e-5

_LAYER_WEIGHTS = ("self_attn_layer_norm", "self_attn.q_proj", "self_attn.v_proj", "self_attn.out_proj", "final_layer_norm", "fc1", "fc2")


class WhisperEncoder(torch.nn.Module):
    """input_features [batch, num_mel_bins, 2 * max_source_positions] -> [batch, max_source_positions, d_model].

    `get(name)` returns a tensor of the checkpoint (already on its device and dtype); `config` is config.json's dict.
    """

    def __init__(self, get: Callable[[str], torch.Tensor], config: dict, prefix: str = ENCODER_PREFIX):
        super().__init__()
        p = prefix
        self.d_model = int(config["d_model"])
        self.heads = int(config["encoder_attention_heads"])
        self.head_dim = self.d_model // self.heads
        self.scaling = self.head_dim**-0.5
        self.num_mel_bins = int(config["num_mel_bins"])
        self.positions = int(config["max_source_positions"])
        self.act = activation(config.get("activation_function", "gelu"))
        self.conv1 = (get(p + "conv1.weight"), get(p + "conv1.bias"))
        self.conv2 = (get(p + "conv2.weight"), get(p + "conv2.bias"))
        self.embed_positions = get(p + "embed_positions.weight")[: self.positions]
        self.layers = []
        for i in range(int(config["encoder_layers"])):
            q = f"{p}layers.{i}."
            w = {n: (get(q + n + ".weight"), get(q + n + ".bias")) for n in _LAYER_WEIGHTS}
            w["self_attn.k_proj"] = (get(q + "self_attn.k_proj.weight"), None)
            self.layers.append(w)
        self.layer_norm = (get(p + "layer_norm.weight"), get(p + "layer_norm.bias"))

    @property
    def num_frames(self) -> int:
        """The mel frames one clip must have: the convolutions halve them to max_source_positions."""
        return 2 * self.positions

    @torch.inference_mode()
    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.shape[1:] != (self.num_mel_bins, self.num_frames):
            raise ValueError(f"Whisper's encoder takes features [batch, {self.num_mel_bins}, {self.num_frames}]; got {tuple(features.shape)}")
        x = features.to(self.conv1[0].dtype)
        x = F.gelu(F.conv1d(x, *self.conv1, padding=1))
        x = F.gelu(F.conv1d(x, *self.conv2, stride=2, padding=1))
        x = x.transpose(1, 2) + self.embed_positions
        for w in self.layers:
            h = F.layer_norm(x, x.shape[-1:], *w["self_attn_layer_norm"], LAYER_NORM_EPS)
            x = x + F.linear(self._attention(h, w), *w["self_attn.out_proj"])
            h = F.layer_norm(x, x.shape[-1:], *w["final_layer_norm"], LAYER_NORM_EPS)
            x = x + F.linear(self.act(F.linear(h, *w["fc1"])), *w["fc2"])
        return F.layer_norm(x, x.shape[-1:], *self.layer_norm, LAYER_NORM_EPS)

    def _attention(self, h: torch.Tensor, w: dict) -> torch.Tensor:
        b, t, d = h.shape
        q = (F.linear(h, *w["self_attn.q_proj"]) * self.scaling).view(b, t, self.heads, -1).transpose(1, 2)
        k, v = (F.linear(h, *w[f"self_attn.{n}_proj"]).view(b, t, self.heads, -1).transpose(1, 2) for n in "kv")
        out = F.scaled_dot_product_attention(q, k, v, scale=1.0)
        return out.transpose(1, 2).reshape(b, t, d)
