"""RGB pixels -> PNG bytes, with the standard library only (zlib).

8-bit RGB, no interlace, filter 0 (None) on every row, zlib level 6: the same
pixels always give the same bytes with the same zlib.
"""

from __future__ import annotations

import struct
import zlib

import torch

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def to_pixels(image: torch.Tensor) -> torch.Tensor:
    """[3, H, W] floats in [0, 1] -> uint8 [H, W, 3] (round half to even, as torch.round)."""
    return torch.round(image.clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 0).contiguous()


def encode_png(pixels: torch.Tensor) -> bytes:
    """uint8 [H, W, 3] -> PNG bytes."""
    if pixels.dtype != torch.uint8 or pixels.dim() != 3 or pixels.shape[2] != 3:
        raise ValueError(f"expected uint8 [H, W, 3] pixels, got {pixels.dtype} {tuple(pixels.shape)}")
    h, w, _ = pixels.shape
    rows = pixels.cpu().numpy().reshape(h, w * 3)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return _SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 6)) + _chunk(b"IEND", b"")
