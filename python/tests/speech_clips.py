"""Speech-like test audio for the Whisper tests: a few chirping harmonics under noise, with a loudness
envelope, mono float32 at 16 kHz (seeded: the same samples every run)."""

from __future__ import annotations

import numpy as np

SR = 16000


def clip(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    f0 = 120.0 + 80.0 * rng.random() + 30.0 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    voice = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 4) * t) ** 2
    return (0.2 * voice * envelope + 0.02 * rng.standard_normal(t.shape)).astype(np.float32)
