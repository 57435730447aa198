"""Qwen2.5-VL's vision side against transformers, on a random directory:
preprocessing equals Qwen2VLImageProcessor's PIL backend (use_fast=False) bit for
bit, min_pixels and max_pixels included, and image_token_count agrees; the
tower's output equals get_image_features for several images of different sizes
in one forward, each image alone gives its rows of the batch, and the window
split matters (a tower with one window per image does not match)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from baton_worker.models.qwen2_5_vl.build import make_qwen2_5_vl_dir

transformers = pytest.importorskip("transformers")
from PIL import Image  # noqa: E402

from baton_worker.model.weights import WeightReader  # noqa: E402
from baton_worker.models.qwen2_5_vl.preprocess import image_token_count, preprocess_images, read_preprocessor_config  # noqa: E402
from baton_worker.models.qwen2_5_vl.vision import Qwen25VisionTower, vision_prefix  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_qwen2_5_vl_dir(tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def hf(model_dir: Path):
    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed + 1000 * width + height)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    pixels = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(pixels[:, :, 0] if mode == "L" else pixels, mode)


def tower(model_dir: Path, **overrides) -> Qwen25VisionTower:
    config = transformers.AutoConfig.from_pretrained(model_dir).vision_config.to_dict() | overrides
    reader = WeightReader(model_dir, torch.float32, torch.device("cpu"))
    return Qwen25VisionTower(reader.get, vision_prefix(reader.files), config)


def reference_features(hf, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """What the language model receives: get_image_features' per-image pooler outputs, concatenated."""
    with torch.no_grad():
        out = hf.model.get_image_features(pixel_values=pixel_values, image_grid_thw=grid_thw)
    return torch.cat(out.pooler_output)


def test_pixel_values_equal_transformers(model_dir: Path) -> None:
    config = read_preprocessor_config(model_dir)
    reference = transformers.Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    cases = {
        "plain": noise(60, 40),
        "min_pixels": noise(20, 20),  # rounds to 28x28 < 56*56: scaled up
        "max_pixels": noise(300, 200),  # rounds to 308x196 > 28*28*64: scaled down
        "tall": noise(57, 131),
        "wide": noise(200, 30),
        "grey": noise(45, 70, "L"),
        "rgba": noise(70, 50, "RGBA"),
    }
    images = list(cases.values())
    pixel_values, grid_thw = preprocess_images(images, config)
    theirs = reference(images, return_tensors="pt")
    assert pixel_values.dtype == torch.float32 and grid_thw.dtype == torch.int64
    assert torch.equal(grid_thw, theirs["image_grid_thw"])
    assert torch.equal(pixel_values, theirs["pixel_values"])  # bitwise
    grids = dict(zip(cases, grid_thw.tolist()))
    assert 28 * 28 < config["min_pixels"] and grids["min_pixels"] == [1, 4, 4]
    assert 308 * 196 > config["max_pixels"] and grids["max_pixels"] == [1, 12, 18]
    for (name, image), (_, h, w) in zip(cases.items(), grid_thw.tolist()):
        count = image_token_count(image.width, image.height, config)
        assert count == h * w // 4 == reference.get_number_of_image_patches(image.height, image.width) // 4, name
    # One image at a time gives the same patches (the batch is a plain concatenation).
    alone = torch.cat([preprocess_images([image], config)[0] for image in images])
    assert torch.equal(alone, pixel_values)


def test_batch_equals_transformers_and_each_image_alone(model_dir: Path, hf) -> None:
    config = read_preprocessor_config(model_dir)
    vision = tower(model_dir)
    # 2x3, 5x2 (partial windows at the edges) and 4x4 (four whole windows) merged tokens.
    images = [noise(60, 40), noise(57, 131), noise(112, 112)]
    pixel_values, grid_thw = preprocess_images(images, config)
    theirs = reference_features(hf, pixel_values, grid_thw)
    ours = vision(pixel_values, grid_thw)
    assert ours.shape == (sum(vision.tokens_per_image(grid_thw)), 64)
    assert vision.tokens_per_image(grid_thw) == [image_token_count(i.width, i.height, config) for i in images]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    rows = torch.split(ours, vision.tokens_per_image(grid_thw))
    for image, batched in zip(images, rows):
        alone = vision(*preprocess_images([image], config))
        torch.testing.assert_close(alone, batched, rtol=1e-5, atol=1e-5)


def test_windows_matter(model_dir: Path, hf) -> None:
    config = read_preprocessor_config(model_dir)
    # 8x5 merged tokens: 4x3 windows of 2x2 merged tokens, the last column half full.
    pixel_values, grid_thw = preprocess_images([noise(140, 224)], config)
    assert grid_thw.tolist() == [[1, 16, 10]]
    theirs = reference_features(hf, pixel_values, grid_thw)
    torch.testing.assert_close(tower(model_dir)(pixel_values, grid_thw), theirs, rtol=1e-5, atol=1e-5)
    # The same weights with other windows: one per image, or 3x3 merged tokens (misaligned).
    for window_size in (10_000, 84):
        wrong = tower(model_dir, window_size=window_size)(pixel_values, grid_thw)
        assert (wrong - theirs).abs().max() > 0.05, window_size
    # Every block full-attention (no windows at all) does not match either.
    full = tower(model_dir, fullatt_block_indexes=[0, 1, 2, 3])(pixel_values, grid_thw)
    assert (full - theirs).abs().max() > 0.05


def test_frames_and_images_in_one_forward(model_dir: Path, hf) -> None:
    """A 2-frame grid (video-shaped) next to an image: windows and full attention stay per frame."""
    grid_thw = torch.tensor([[2, 4, 8], [1, 6, 4]])
    generator = torch.Generator().manual_seed(3)
    pixel_values = torch.randn(2 * 4 * 8 + 6 * 4, 3 * 2 * 14 * 14, generator=generator)
    with torch.no_grad():
        theirs = hf.model.visual(pixel_values, grid_thw=grid_thw).pooler_output
    torch.testing.assert_close(tower(model_dir)(pixel_values, grid_thw), theirs, rtol=1e-5, atol=1e-5)
