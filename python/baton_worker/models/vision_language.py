"""What every vision-language model here shares: the encoder-decoder graph
(encoder_decoder.py) with a stateless `vision` node whose image_embeds replace
the image tokens' embeddings in the kv_cache `llm` node's prefill, image
decoding and its errors, and reading a prompt's images.

A model subclasses VisionLanguageGraph and says which prompt values its vision
node takes (`encoder_inputs`) and which further prompt values its prefill takes
after the token ids and image_embeds (`prefill_prompt_inputs`: Qwen2.5-VL's
rotary positions), and builds its tower in `encoder_submodule`.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from .encoder_decoder import TEXT_INPUTS, EncoderDecoderGraph

# The formats a data: URL may carry (image/png, image/jpeg, image/webp).
FORMATS = ("PNG", "JPEG", "WEBP")
# Decompression-bomb guard: PIL warns past ~89M pixels by default; refuse instead.
MAX_PIXELS = 64 * 1024 * 1024

VISION, LLM, IMAGE_EMBEDS = "vision", "llm", "image_embeds"

__all__ = ["IMAGE_EMBEDS", "LLM", "TEXT_INPUTS", "VISION", "MediaError", "VisionLanguageGraph", "decode_image", "prompt_images"]


class VisionLanguageGraph(EncoderDecoderGraph):
    model_dir: Path
    encoder_node = VISION
    decoder_node = LLM
    encoder_output = IMAGE_EMBEDS


class MediaError(ValueError):
    """One image of a request cannot be used; the message names its part."""


def decode_image(data: bytes, param: str):
    """The image in `data` (a PIL image), fully decoded: a truncated file fails here, not later. MediaError
    naming the request's part for an empty, unsupported, undecodable or oversized image."""
    from PIL import Image, UnidentifiedImageError

    if len(data) == 0:
        raise MediaError(f"{param}: the image is empty (0 bytes)")
    try:
        image = Image.open(io.BytesIO(data))
        if image.format not in FORMATS:
            raise MediaError(f"{param}: unsupported image format {image.format}; supported: PNG, JPEG, WebP")
        if image.width * image.height > MAX_PIXELS:
            raise MediaError(f"{param}: the image is too large ({image.width}x{image.height} pixels)")
        image.load()
    except MediaError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise MediaError(f"{param}: cannot decode the image: {e}") from None
    if image.width == 0 or image.height == 0:
        raise MediaError(f"{param}: the image has no pixels ({image.width}x{image.height})")
    return image


def prompt_images(kwargs: dict) -> tuple[np.ndarray, list[bytes], list[str]]:
    """process_prompt's keyword arguments for a prompt with images: its token ids, each image's bytes, and
    each image's place in the request (for error messages)."""
    ids = np.asarray(kwargs.get("token_ids", []), np.int64)
    images = [bytes(b) for b in kwargs.get("images", [])]
    params = list(kwargs.get("image_params", [])) or [f"image {i}" for i in range(len(images))]
    return ids, images, params
