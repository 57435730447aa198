"""Image preprocessing for Qwen2.5-VL, from the directory's
preprocessor_config.json, done as transformers' Qwen2VLImageProcessor (the PIL
backend, use_fast=False) does it, so pixel values match its own bit for bit:

  convert to RGB -> resize (PIL, bicubic) to smart_resize's size: both sides a
  multiple of patch*merge, the pixel count within [min_pixels, max_pixels], the
  aspect ratio kept as well as that allows -> rescale (in float64, then float32)
  -> normalize (float32) -> patchify: each image is repeated to temporal_patch_size
  frames and cut into patch*patch squares, flattened C, T, P, P, in the order the
  vision tower consumes them: merge*merge blocks row-major, the patches of a
  block together (row-major inside it).

The resolution is dynamic, so an image's token count depends on its size:
image_token_count gives it (the <|image_pad|> tokens the prompt needs).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

# Qwen2VLImageProcessor's defaults, for keys a preprocessor_config.json leaves out.
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
BICUBIC = 3
# smart_resize refuses more extreme aspect ratios (so does transformers).
MAX_ASPECT_RATIO = 200


def read_preprocessor_config(model_dir: str | Path) -> dict:
    """The directory's preprocessor_config.json with every setting the
    preprocessing uses resolved (defaults filled in, min/max pixels taken from
    `size` or the top-level keys, the latter winning as in transformers)."""
    path = Path(model_dir) / "preprocessor_config.json"
    raw = json.loads(path.read_text()) if path.is_file() else {}
    return _resolve(raw)


def _resolve(raw: dict) -> dict:
    size = raw.get("size") or {}
    if not isinstance(size, dict):
        raise ValueError(f"preprocessor_config.json: size must be a dict, got {size!r}")
    min_pixels = raw.get("min_pixels")
    max_pixels = raw.get("max_pixels")
    if min_pixels is None:
        min_pixels = size.get("shortest_edge", size.get("min_pixels", DEFAULT_MIN_PIXELS))
    if max_pixels is None:
        max_pixels = size.get("longest_edge", size.get("max_pixels", DEFAULT_MAX_PIXELS))
    mean, std = raw.get("image_mean", CLIP_MEAN), raw.get("image_std", CLIP_STD)
    return {
        "min_pixels": int(min_pixels),
        "max_pixels": int(max_pixels),
        "patch_size": int(raw.get("patch_size", 14)),
        "merge_size": int(raw.get("merge_size", 2)),
        "temporal_patch_size": int(raw.get("temporal_patch_size", 2)),
        "do_resize": bool(raw.get("do_resize", True)),
        "resample": int(raw.get("resample", BICUBIC)),
        "do_rescale": bool(raw.get("do_rescale", True)),
        "rescale_factor": float(raw.get("rescale_factor", 1 / 255)),
        "do_normalize": bool(raw.get("do_normalize", True)),
        "image_mean": [float(m) for m in mean] if isinstance(mean, (list, tuple)) else [float(mean)] * 3,
        "image_std": [float(s) for s in std] if isinstance(std, (list, tuple)) else [float(std)] * 3,
        "do_convert_rgb": bool(raw.get("do_convert_rgb", True)),
    }


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) both multiples of `factor`, with about the same aspect ratio
    and a pixel count within [min_pixels, max_pixels] (transformers' rounding, exactly)."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"the image's aspect ratio must be at most {MAX_ASPECT_RATIO}:1, got {width}x{height}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _target_size(width: int, height: int, settings: dict) -> tuple[int, int]:
    """(height, width) the image is resized to (its own size without do_resize)."""
    if not settings["do_resize"]:
        return height, width
    factor = settings["patch_size"] * settings["merge_size"]
    return smart_resize(height, width, factor, settings["min_pixels"], settings["max_pixels"])


def image_token_count(width: int, height: int, config: dict) -> int:
    """The number of <|image_pad|> tokens (= image embedding rows) a width x height image becomes."""
    settings = _resolve(config)
    h, w = _target_size(width, height, settings)
    patch, merge = settings["patch_size"], settings["merge_size"]
    return (h // patch) * (w // patch) // (merge * merge)


def preprocess_images(images: list[Image.Image], config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixel_values float32 [sum of t*h*w patches, C*T*P*P], grid_thw int64 [images, 3]),
    the images' patches concatenated in order; t is 1 for an image."""
    settings = _resolve(config)
    patches, grids = [], []
    for image in images:
        flat, grid = _patches(image, settings)
        patches.append(flat)
        grids.append(grid)
    if not patches:
        s = settings
        return torch.zeros(0, 3 * s["temporal_patch_size"] * s["patch_size"] ** 2), torch.zeros(0, 3, dtype=torch.int64)
    return torch.from_numpy(np.concatenate(patches)), torch.tensor(grids, dtype=torch.int64)


def _patches(image: Image.Image, s: dict) -> tuple[np.ndarray, tuple[int, int, int]]:
    if s["do_convert_rgb"] and image.mode != "RGB":
        image = image.convert("RGB")
    height, width = _target_size(image.width, image.height, s)
    if s["do_resize"]:
        image = image.resize((width, height), resample=s["resample"])
    pixels = np.array(image)
    pixels = pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)  # channels first
    if s["do_rescale"]:
        # float64 first, then float32: transformers' rounding, so values match bitwise.
        pixels = (pixels.astype(np.float64) * s["rescale_factor"]).astype(np.float32)
    else:
        pixels = pixels.astype(np.float32)
    if s["do_normalize"]:
        mean = np.array(s["image_mean"], np.float32)[:, None, None]
        std = np.array(s["image_std"], np.float32)[:, None, None]
        pixels = (pixels - mean) / std
    patch, merge, temporal = s["patch_size"], s["merge_size"], s["temporal_patch_size"]
    if height % (patch * merge) or width % (patch * merge):
        raise ValueError(f"a {width}x{height} image does not divide into {patch * merge}-pixel blocks (do_resize is off)")
    channels = pixels.shape[0]
    grid_h, grid_w = height // patch, width // patch
    blocks = pixels.reshape(channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
    # -> (block row, block col, row in block, col in block, C, P, P)
    blocks = blocks.transpose(1, 4, 2, 5, 0, 3, 6)
    # A still image is `temporal` identical frames (the patch embedding is a Conv3d over time).
    frames = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], temporal, patch, patch))
    return frames.reshape(grid_h * grid_w, channels * temporal * patch * patch), (1, grid_h, grid_w)
