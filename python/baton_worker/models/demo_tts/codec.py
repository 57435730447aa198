"""The codec: a small convolutional decoder from code frames to 24 kHz PCM.

    codes [B, frames, codes_per_frame] (int, each in 0..codebook_size-1)
      -> embedding per (position, code), concatenated per frame   [B, frames, Q*E]
      -> Conv1d(k=3) over frames, LeakyReLU                        [B, hidden, frames]
      -> ConvTranspose1d(kernel 2s, stride s, padding s/2) per up-stride s, LeakyReLU
      -> Conv1d(k=7) to one channel, tanh                          [B, frames * samples_per_frame]

With even strides a transposed convolution of kernel 2s and padding s/2 maps
length L to exactly L*s, so frames * samples_per_frame samples come out.

It computes in float64 and returns float32. The PCM a request gets must be the
same bytes whatever batch its window shares, whatever worker runs it and
whatever the reference does: float32 convolutions differ in the last bits with
the batch size and thread count, and after scaling to 16 bits a one-ulp
difference flips a sample's rounding about once per frame; in float64 such a
flip is out of reach.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from .spec import CodecSpec

COMPUTE_DTYPE = torch.float64
_SLOPE = 0.1
# He-style gain keeps activations near unit scale through the LeakyReLU stack;
# the output layer's small gain puts tanh's input at std ~0.25 (about -12 dBFS, rarely clipped).
_HIDDEN_GAIN = 2**0.5
_OUT_GAIN = 0.25


class CodecDecoder(nn.Module):
    def __init__(self, spec: CodecSpec):
        super().__init__()
        if any(s % 2 for s in spec.up_strides):
            raise ValueError("codec up-strides must be even")
        self.spec = spec
        q, c, e = spec.codes_per_frame, spec.codebook_size, spec.embed_dim
        self.embed = nn.Embedding(q * c, e)
        self.conv_in = nn.Conv1d(q * e, spec.hidden, kernel_size=3, padding=1)
        ups = []
        channels = spec.hidden
        for out, stride in zip(spec.up_channels, spec.up_strides, strict=True):
            ups.append(nn.ConvTranspose1d(channels, out, kernel_size=2 * stride, stride=stride, padding=stride // 2))
            channels = out
        self.ups = nn.ModuleList(ups)
        self.conv_out = nn.Conv1d(channels, 1, kernel_size=spec.out_kernel, padding=spec.out_kernel // 2)
        # Offsets that turn (position, code) into a row of the shared embedding table.
        self.register_buffer("position_offsets", torch.arange(q) * c, persistent=False)
        self.to(COMPUTE_DTYPE)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes: int [B, frames, codes_per_frame] -> float32 PCM [B, frames * samples_per_frame]."""
        batch, frames, q = codes.shape
        if q != self.spec.codes_per_frame:
            raise ValueError(f"expected {self.spec.codes_per_frame} codes per frame, got {q}")
        rows = codes.to(torch.int64) + self.position_offsets
        x = self.embed(rows).reshape(batch, frames, -1).transpose(1, 2)  # [B, Q*E, frames]
        x = functional.leaky_relu(self.conv_in(x), _SLOPE)
        for up in self.ups:
            x = functional.leaky_relu(up(x), _SLOPE)
        return torch.tanh(self.conv_out(x))[:, 0, :].to(torch.float32)


def random_codec_weights(spec: CodecSpec, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Deterministic random weights (float32), scaled so the output is neither silent nor clipped."""
    shapes = {name: p.shape for name, p in CodecDecoder(spec).state_dict().items()}
    weights = {}
    for name in sorted(shapes):
        shape = shapes[name]
        if name == "embed.weight":
            t = torch.randn(shape, generator=generator)
        elif name.endswith(".bias"):
            t = 0.05 * torch.randn(shape, generator=generator)
        else:
            # Conv1d weight [out, in, k]: fan-in in*k; ConvTranspose1d weight
            # [in, out, k]: each output sample sums in*(k/stride) = in*2 terms.
            fan_in = shape[1] * shape[2] if not name.startswith("ups.") else shape[0] * 2
            gain = _OUT_GAIN if name.startswith("conv_out") else _HIDDEN_GAIN
            t = torch.randn(shape, generator=generator) * (gain / fan_in**0.5)
        weights[name] = t.to(torch.float32).contiguous()
    return weights


def load_codec(spec: CodecSpec, weights: dict[str, torch.Tensor], device: torch.device | str = "cpu") -> CodecDecoder:
    decoder = CodecDecoder(spec)
    decoder.load_state_dict({k: v.to(COMPUTE_DTYPE) for k, v in weights.items()})
    return decoder.to(device).eval()
