"""The demo image model's three networks, computed in float64.

    TextEncoder  prompt ids [B, L] -> pooled text embedding [B, hidden]
                 (byte + position embeddings, pre-LN transformer layers with a
                 padding mask, final LayerNorm, mean over the real tokens)
    Denoiser     latents [B, C, h, w], timesteps [B], text [B, hidden] -> predicted noise [B, C, h, w]
                 (conv in, residual blocks of GroupNorm/SiLU/conv whose middle
                 is scaled and shifted by (sinusoidal time embedding + text), conv out)
    Decoder      latents [B, C, h, w] -> RGB in [0, 1], [B, 3, h*2^k, w*2^k]
                 (conv in, k stages of nearest x2 upsampling + conv + SiLU, conv out, sigmoid)

Float64 for the reason the TTS codec gives: the pixels a request gets must be
the same bytes whatever batch it shares and whatever the reference does;
float32 kernels differ in the last bits with the batch size, which flips a
pixel's 8-bit rounding now and then; in float64 such a flip is out of reach.
Weights are stored as float32 and widened on load.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional

from .spec import DecoderSpec, DemoImageSpec, DenoiserSpec, TextSpec

COMPUTE_DTYPE = torch.float64


class _TextLayer(nn.Module):
    def __init__(self, s: TextSpec):
        super().__init__()
        self.heads = s.heads
        self.norm1 = nn.LayerNorm(s.hidden)
        self.qkv = nn.Linear(s.hidden, 3 * s.hidden)
        self.proj = nn.Linear(s.hidden, s.hidden)
        self.norm2 = nn.LayerNorm(s.hidden)
        self.fc1 = nn.Linear(s.hidden, s.mlp)
        self.fc2 = nn.Linear(s.mlp, s.hidden)

    def forward(self, x: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + key_bias[:, None, None, :]
        attn = torch.softmax(scores, dim=-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(functional.gelu(self.fc1(self.norm2(x))))


class TextEncoder(nn.Module):
    def __init__(self, s: TextSpec):
        super().__init__()
        self.spec = s
        self.embed = nn.Embedding(s.vocab_size, s.hidden)
        self.position = nn.Embedding(s.max_len, s.hidden)
        self.layers = nn.ModuleList(_TextLayer(s) for _ in range(s.layers))
        self.norm = nn.LayerNorm(s.hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids: int64 [B, max_len] (pad-padded) -> float64 [B, hidden]."""
        real = ids != self.spec.pad
        x = self.embed(ids) + self.position.weight[None, : ids.shape[1]]
        key_bias = torch.zeros(real.shape, dtype=x.dtype, device=x.device).masked_fill(~real, float("-inf"))
        for layer in self.layers:
            x = layer(x, key_bias)
        x = self.norm(x) * real[..., None]
        return x.sum(dim=1) / real.sum(dim=1, keepdim=True)


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of integer timesteps [B] -> [B, dim] (float64)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=COMPUTE_DTYPE, device=t.device) / half)
    angles = t.to(COMPUTE_DTYPE)[:, None] * freqs[None]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=1)


class _ResBlock(nn.Module):
    def __init__(self, s: DenoiserSpec):
        super().__init__()
        c = s.channels
        self.norm1 = nn.GroupNorm(s.groups, c)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.film = nn.Linear(s.time_dim, 2 * c)
        self.norm2 = nn.GroupNorm(s.groups, c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.conv1(functional.silu(self.norm1(x)))
        scale, shift = self.film(cond)[:, :, None, None].chunk(2, dim=1)
        h = h * (1 + scale) + shift
        return x + self.conv2(functional.silu(self.norm2(h)))


class Denoiser(nn.Module):
    def __init__(self, s: DenoiserSpec, latent_channels: int, text_hidden: int):
        super().__init__()
        self.spec = s
        self.time_mlp = nn.Sequential(nn.Linear(s.time_dim, s.time_dim), nn.SiLU(), nn.Linear(s.time_dim, s.time_dim))
        self.text_proj = nn.Linear(text_hidden, s.time_dim)
        self.conv_in = nn.Conv2d(latent_channels, s.channels, 3, padding=1)
        self.blocks = nn.ModuleList(_ResBlock(s) for _ in range(s.blocks))
        self.norm_out = nn.GroupNorm(s.groups, s.channels)
        self.conv_out = nn.Conv2d(s.channels, latent_channels, 3, padding=1)

    def forward(self, latents: torch.Tensor, timesteps: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        cond = functional.silu(self.time_mlp(timestep_embedding(timesteps, self.spec.time_dim)) + self.text_proj(text))
        x = self.conv_in(latents)
        for block in self.blocks:
            x = block(x, cond)
        return self.conv_out(functional.silu(self.norm_out(x)))


class Decoder(nn.Module):
    def __init__(self, s: DecoderSpec, latent_channels: int):
        super().__init__()
        self.conv_in = nn.Conv2d(latent_channels, s.channels[0], 3, padding=1)
        stages = []
        previous = s.channels[0]
        for c in s.channels:
            stages.append(nn.Conv2d(previous, c, 3, padding=1))
            previous = c
        self.ups = nn.ModuleList(stages)
        self.conv_out = nn.Conv2d(previous, 3, 3, padding=1)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        x = functional.silu(self.conv_in(latents))
        for conv in self.ups:
            x = functional.silu(conv(functional.interpolate(x, scale_factor=2, mode="nearest")))
        return torch.sigmoid(self.conv_out(x))


class DemoImageNetworks(nn.Module):
    """All three networks; their state_dict keys are the checkpoint's names (text., denoiser., decoder.)."""

    def __init__(self, spec: DemoImageSpec):
        super().__init__()
        self.text = TextEncoder(spec.text)
        self.denoiser = Denoiser(spec.denoiser, spec.latent_channels, spec.text.hidden)
        self.decoder = Decoder(spec.decoder, spec.latent_channels)


# PyTorch's default init shrinks activations through the decoder (pre-sigmoid std ~0.05, a flat
# grey image); this gain on its last conv brings that std to ~2, so images have visible contrast.
DECODER_OUT_GAIN = 40.0


def random_weights(spec: DemoImageSpec, seed: int) -> dict[str, torch.Tensor]:
    """Deterministic random weights (float32): PyTorch's default initialisation under a fixed seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        nets = DemoImageNetworks(spec)
    weights = {name: t.detach().to(torch.float32).contiguous() for name, t in sorted(nets.state_dict().items())}
    weights["decoder.conv_out.weight"] *= DECODER_OUT_GAIN
    return weights


def load_networks(spec: DemoImageSpec, weights: dict[str, torch.Tensor], device: torch.device | str = "cpu") -> DemoImageNetworks:
    nets = DemoImageNetworks(spec)
    nets.load_state_dict({k: v.to(COMPUTE_DTYPE) for k, v in weights.items()})
    return nets.to(device=device, dtype=COMPUTE_DTYPE).eval()
