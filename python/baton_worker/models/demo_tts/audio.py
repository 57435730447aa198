"""PCM float -> the bytes a client gets.

s16le mono: each sample is clamped to [-1, 1], scaled by 32767 and rounded
with torch.round (half to even), so +1.0 -> 32767 and -1.0 -> -32767 (the
scale is symmetric; -32768 never occurs). Little-endian whatever the host.
"""

from __future__ import annotations

import numpy as np
import torch


def pcm_to_s16le(pcm: torch.Tensor) -> bytes:
    samples = torch.round(pcm.detach().to(torch.float32).reshape(-1).clamp(-1.0, 1.0) * 32767.0).to(torch.int16)
    return samples.cpu().numpy().astype("<i2", copy=False).tobytes()


def s16le_to_array(data: bytes) -> np.ndarray:
    """The inverse view (int16 samples), for tests and tools."""
    return np.frombuffer(data, dtype="<i2")
