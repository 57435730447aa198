"""Image decoding and preprocessing for LLaVA, from the directory's
preprocessor_config.json (CLIP's image processor: convert to RGB, resize the
shortest edge, center crop, rescale, normalize), done as transformers' PIL
backend does it, so pixel values match transformers' own.

A bad image raises MediaError naming the request's part ("messages[0].content[1]: ...").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from ..vision_language import MediaError, decode_image


@dataclass(frozen=True)
class ImageProcessing:
    do_convert_rgb: bool
    do_resize: bool
    shortest_edge: int
    resample: int
    do_center_crop: bool
    crop: tuple[int, int]  # (height, width)
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    mean: np.ndarray  # float32 [3]
    std: np.ndarray

    @staticmethod
    def from_dir(model_dir: Path, image_size: int) -> "ImageProcessing":
        path = Path(model_dir) / "preprocessor_config.json"
        raw = json.loads(path.read_text()) if path.is_file() else {}
        size = raw.get("size", {"shortest_edge": image_size})
        shortest = size.get("shortest_edge") if isinstance(size, dict) else size
        if not isinstance(shortest, int):
            raise ValueError(f"{path}: size must give shortest_edge, got {size!r}")
        crop = raw.get("crop_size", {"height": image_size, "width": image_size})
        crop = (crop, crop) if isinstance(crop, int) else (int(crop["height"]), int(crop["width"]))
        return ImageProcessing(
            do_convert_rgb=bool(raw.get("do_convert_rgb", True)),
            do_resize=bool(raw.get("do_resize", True)),
            shortest_edge=shortest,
            resample=int(raw.get("resample", 3)),
            do_center_crop=bool(raw.get("do_center_crop", True)),
            crop=crop,
            do_rescale=bool(raw.get("do_rescale", True)),
            rescale_factor=float(raw.get("rescale_factor", 1 / 255)),
            do_normalize=bool(raw.get("do_normalize", True)),
            mean=np.array(raw.get("image_mean", [0.48145466, 0.4578275, 0.40821073]), np.float32),
            std=np.array(raw.get("image_std", [0.26862954, 0.26130258, 0.27577711]), np.float32),
        )

    def decode(self, data: bytes, param: str) -> Image.Image:
        return decode_image(data, param)

    def pixel_values(self, image: Image.Image) -> np.ndarray:
        """float32 [3, height, width], as transformers' CLIP image processor (PIL backend) computes it."""
        if self.do_convert_rgb and image.mode != "RGB":
            image = image.convert("RGB")
        if self.do_resize:
            width, height = image.size
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
            new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
            image = image.resize((new_w, new_h), resample=self.resample)
        pixels = np.array(image)
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        pixels = pixels.transpose(2, 0, 1)
        if self.do_center_crop:
            pixels = _center_crop(pixels, *self.crop)
        out = pixels.astype(np.float64) * self.rescale_factor if self.do_rescale else pixels.astype(np.float64)
        out = out.astype(np.float32)
        if self.do_normalize:
            out = (out - self.mean[:, None, None]) / self.std[:, None, None]
        return np.ascontiguousarray(out, dtype=np.float32)


def _center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """Channels-first center crop, zero-padded where the image is smaller (transformers' rule)."""
    _, h, w = pixels.shape
    if h < height or w < width:
        padded = np.zeros((pixels.shape[0], max(h, height), max(w, width)), pixels.dtype)
        top, left = (padded.shape[1] - h) // 2, (padded.shape[2] - w) // 2
        padded[:, top : top + h, left : left + w] = pixels
        pixels, (_, h, w) = padded, padded.shape
    top, left = (h - height) // 2, (w - width) // 2
    return pixels[:, top : top + height, left : left + width]
