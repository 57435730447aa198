"""The batched computations both the graph's nodes and the reference loop run.

Each takes a list of per-image tensors (any batch, mixed sizes) and returns
one result per image, in order. Images of one size are stacked and run as one
forward; the graph's nodes call these once per batch of passes, the
reference once per image, so both compute the same thing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from .networks import DemoImageNetworks, load_networks
from .schedule import DDIMSchedule
from .spec import DemoImageSpec


class DemoImagePipeline:
    def __init__(self, spec: DemoImageSpec, nets: DemoImageNetworks):
        self.spec = spec
        self.nets = nets
        self.schedule = DDIMSchedule(spec.schedule)

    @staticmethod
    def load(model_dir: str | Path, device: torch.device | str = "cpu") -> DemoImagePipeline:
        spec = DemoImageSpec.from_dir(model_dir)
        return DemoImagePipeline(spec, load_networks(spec, load_file(str(Path(model_dir) / spec.weights)), device))

    @torch.inference_mode()
    def encode_text(self, ids: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Prompt ids (int64 [max_len] each) -> text embeddings (float64 [hidden] each)."""
        return list(self.nets.text(torch.stack(list(ids))).unbind(0))

    @torch.inference_mode()
    def denoise_step(
        self, latents: Sequence[torch.Tensor], texts: Sequence[torch.Tensor], steps: Sequence[int], num_steps: Sequence[int]
    ) -> list[torch.Tensor]:
        """One DDIM step per image: image i is at step steps[i] of num_steps[i]."""
        out: list[torch.Tensor | None] = [None] * len(latents)
        for group in _by_shape(latents):
            s = self.schedule
            x = torch.stack([latents[i] for i in group])
            t = torch.tensor([s.timestep(steps[i], num_steps[i]) for i in group], dtype=torch.int64, device=x.device)
            a_t = torch.tensor([s.alpha_bar(steps[i], num_steps[i]) for i in group], dtype=x.dtype, device=x.device)
            a_prev = torch.tensor([s.alpha_bar(steps[i] + 1, num_steps[i]) for i in group], dtype=x.dtype, device=x.device)
            eps = self.nets.denoiser(x, t, torch.stack([texts[i] for i in group]))
            for i, value in zip(group, s.update(x, eps, a_t, a_prev).unbind(0)):
                out[i] = value
        return out  # type: ignore[return-value]  (every index is in one group)

    @torch.inference_mode()
    def decode(self, latents: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Latents -> RGB in [0, 1], [3, H, W] each."""
        out: list[torch.Tensor | None] = [None] * len(latents)
        for group in _by_shape(latents):
            images = self.nets.decoder(torch.stack([latents[i] for i in group]))
            for i, image in zip(group, images.unbind(0)):
                out[i] = image
        return out  # type: ignore[return-value]


def _by_shape(tensors: Sequence[torch.Tensor]) -> list[list[int]]:
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(tuple(t.shape), []).append(i)
    return list(groups.values())
