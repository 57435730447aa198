"""The denoiser's noise schedule: DDIM with eta 0 (deterministic), trailing timestep spacing.

For a request of N steps, step k (0-based) runs the denoiser at timestep
t_k = round(T - k * T / N) - 1 (T = train steps; t_0 = T - 1) and moves the
latents to the previous timestep t_{k+1}, or to the clean image after the
last step (alpha_bar = 1 there):

    x0     = clip((x - sqrt(1 - a_t) * eps) / sqrt(a_t), +-clip_sample)
    x_prev = sqrt(a_prev) * x0 + sqrt(1 - a_prev) * eps

Everything is float64 and elementwise per image, so an image's update does
not depend on the batch it shares.
"""

from __future__ import annotations

import torch

from .spec import ScheduleSpec


class DDIMSchedule:
    def __init__(self, spec: ScheduleSpec):
        self.spec = spec
        betas = torch.linspace(spec.beta_start**0.5, spec.beta_end**0.5, spec.train_steps, dtype=torch.float64) ** 2
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)

    def timestep(self, step: int, num_steps: int) -> int:
        t = self.spec.train_steps
        return int(round(t - step * t / num_steps)) - 1

    def alpha_bar(self, step: int, num_steps: int) -> float:
        """alpha_bar at the timestep of `step`; 1 past the last step."""
        if step >= num_steps:
            return 1.0
        return float(self.alphas_cumprod[self.timestep(step, num_steps)])

    def update(self, x: torch.Tensor, eps: torch.Tensor, a_t: torch.Tensor, a_prev: torch.Tensor) -> torch.Tensor:
        """One DDIM step for a batch: x, eps [B, C, h, w]; a_t, a_prev [B] (float64)."""
        a_t = a_t.reshape(-1, 1, 1, 1)
        a_prev = a_prev.reshape(-1, 1, 1, 1)
        x0 = ((x - (1 - a_t).sqrt() * eps) / a_t.sqrt()).clamp(-self.spec.clip_sample, self.spec.clip_sample)
        return a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps
