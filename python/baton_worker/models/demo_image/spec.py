"""The demo image model's fixed shape: what it generates and how its networks are sized.

One definition: the builder writes these into the model directory's
config.json, and everything at run time reads them back from there
(`DemoImageSpec.from_dir`); the HTTP frontend reads the `image_generation`
block of the same file (sizes, step bounds, n) to validate requests.

Prompt ids: [bos] + the prompt's UTF-8 bytes (id = byte value), cut to
`text.max_len` ids, then padded with `pad` to exactly `text.max_len` (the
encoder always sees the same length, so a prompt's embedding does not depend
on the batch it shares).

Noise: image `index` of a request with `seed` starts from standard normal
latents drawn by torch's CPU generator seeded with `noise_seed(seed, index)`,
so the same (seed, index) always gives the same image and the n images of
one request differ.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ARCHITECTURE = "BatonDemoImage"


@dataclass(frozen=True)
class TextSpec:
    vocab_size: int = 258  # 256 bytes, bos, pad
    bos: int = 256
    pad: int = 257
    max_len: int = 64
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    mlp: int = 128


@dataclass(frozen=True)
class DenoiserSpec:
    channels: int = 32
    blocks: int = 2
    groups: int = 8
    time_dim: int = 64


@dataclass(frozen=True)
class DecoderSpec:
    channels: tuple[int, ...] = (48, 32, 16)  # one x2 upsampling stage per entry


@dataclass(frozen=True)
class ScheduleSpec:
    """DDIM with eta 0 over a scaled-linear beta schedule; trailing timestep spacing."""

    train_steps: int = 1000
    beta_start: float = 0.00085
    beta_end: float = 0.012
    clip_sample: float = 2.0  # the predicted clean latents are clipped to +-this


@dataclass(frozen=True)
class GenerationSpec:
    """What the API accepts (the frontend validates against this block)."""

    sizes: tuple[str, ...] = ("32x32", "64x64", "128x128", "256x256")
    default_size: str = "64x64"
    default_inference_steps: int = 4
    max_inference_steps: int = 50  # the denoise loop's max_iters
    max_n: int = 10


@dataclass(frozen=True)
class DemoImageSpec:
    latent_channels: int = 4
    text: TextSpec = TextSpec()
    denoiser: DenoiserSpec = DenoiserSpec()
    decoder: DecoderSpec = DecoderSpec()
    schedule: ScheduleSpec = ScheduleSpec()
    generation: GenerationSpec = GenerationSpec()
    weights: str = "model.safetensors"

    def __post_init__(self) -> None:
        g = self.generation
        if g.default_size not in g.sizes:
            raise ValueError("default_size must be one of sizes")
        for size in g.sizes:
            w, h = parse_size(size)
            if w % self.scale_factor or h % self.scale_factor:
                raise ValueError(f"size {size} is not a multiple of the decoder's scale factor {self.scale_factor}")
        if not 1 <= g.default_inference_steps <= g.max_inference_steps:
            raise ValueError("default_inference_steps must be in 1..max_inference_steps")

    @property
    def scale_factor(self) -> int:
        return 2 ** len(self.decoder.channels)

    def latent_shape(self, size: str) -> tuple[int, int, int]:
        """[channels, height, width] of the latents of an image of `size` ("WxH")."""
        if size not in self.generation.sizes:
            raise ValueError(f"size {size!r} is not supported (supported: {', '.join(self.generation.sizes)})")
        w, h = parse_size(size)
        return (self.latent_channels, h // self.scale_factor, w // self.scale_factor)

    def check_steps(self, steps: int) -> int:
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= self.generation.max_inference_steps:
            raise ValueError(f"num_inference_steps must be an integer in 1..{self.generation.max_inference_steps}, got {steps!r}")
        return steps

    def to_config(self) -> dict:
        g = self.generation
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "baton_demo_image",
            "latent_channels": self.latent_channels,
            "text": asdict(self.text),
            "denoiser": asdict(self.denoiser),
            "decoder": {"channels": list(self.decoder.channels)},
            "schedule": asdict(self.schedule),
            "weights": self.weights,
            "image_generation": {
                "sizes": list(g.sizes),
                "default_size": g.default_size,
                "default_inference_steps": g.default_inference_steps,
                "max_inference_steps": g.max_inference_steps,
                "max_n": g.max_n,
                "max_prompt_tokens": self.text.max_len,
                "latent_downsampling": self.scale_factor,
            },
        }

    @staticmethod
    def from_config(raw: dict) -> DemoImageSpec:
        if ARCHITECTURE not in (raw.get("architectures") or []):
            raise ValueError(f"config.json is not a {ARCHITECTURE} model")
        gen = {k: v for k, v in raw["image_generation"].items() if k not in ("max_prompt_tokens", "latent_downsampling")}
        gen["sizes"] = tuple(gen["sizes"])
        return DemoImageSpec(
            latent_channels=int(raw["latent_channels"]),
            text=TextSpec(**raw["text"]),
            denoiser=DenoiserSpec(**raw["denoiser"]),
            decoder=DecoderSpec(channels=tuple(raw["decoder"]["channels"])),
            schedule=ScheduleSpec(**raw["schedule"]),
            generation=GenerationSpec(**gen),
            weights=str(raw["weights"]),
        )

    @staticmethod
    def from_dir(model_dir: str | Path) -> DemoImageSpec:
        return DemoImageSpec.from_config(json.loads((Path(model_dir) / "config.json").read_text()))


def parse_size(size: str) -> tuple[int, int]:
    """"WxH" -> (width, height)."""
    w, sep, h = size.partition("x")
    if not sep or not w.isdigit() or not h.isdigit():
        raise ValueError(f"size must look like 64x64, got {size!r}")
    return int(w), int(h)


def prompt_ids(prompt: str, text: TextSpec) -> torch.Tensor:
    """[bos, UTF-8 bytes...] cut to max_len and padded with pad: int64 [max_len]."""
    ids = [text.bos, *prompt.encode("utf-8")][: text.max_len]
    return torch.tensor(ids + [text.pad] * (text.max_len - len(ids)), dtype=torch.int64)


def noise_seed(seed: int, index: int) -> int:
    """The generator seed of image `index` of a request with `seed` (any integer)."""
    digest = hashlib.sha256(f"baton-demo-image:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def initial_latents(spec: DemoImageSpec, size: str, seed: int, index: int) -> torch.Tensor:
    """Standard normal latents [C, h, w], float64, for image `index` of a request with `seed`."""
    g = torch.Generator().manual_seed(noise_seed(seed, index))
    return torch.randn(spec.latent_shape(size), generator=g, dtype=torch.float64)
