"""Qwen3-Omni's vision encoder (baton_worker.models.qwen3_omni.vision) against transformers'
Qwen3OmniMoeForConditionalGeneration on the tiny random directory (build.py), CPU, float32:

- qwen2_5_vl.preprocess, given the directory's image processor settings (patches of 16, 2x2 merges), makes
  the processor's pixel values and grids bit for bit (min_pixels and max_pixels included), and
  image_token_count is the processor's <|image_pad|> count;
- one image at a time (64x48, 100x37, 32x32 scaled up, 200x120, 400x300 scaled down) the embeddings and
  both deepstack features equal the thinker's get_image_features bit for bit;
- several images of different sizes in one call give each image's rows of one-at-a-time calls and of
  transformers' own batched call (attention never crosses images);
- a 2-frame (video-shaped) grid next to an image: attention stays within each frame, the position table is
  the frame's for every frame.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_omni_moe")
from PIL import Image  # noqa: E402

from baton_worker.model.weights import WeightReader  # noqa: E402
from baton_worker.models.qwen2_5_vl.preprocess import image_token_count, preprocess_images  # noqa: E402
from baton_worker.models.qwen3_omni import build  # noqa: E402
from qwen3_omni_fixtures import OMNI_MARKS, TOKENIZER_DIR, hf, model_dir, processor  # noqa: E402,F401  (fixtures)
from baton_worker.models.qwen3_omni.vision import (  # noqa: E402
    VISION_PREFIX,
    Qwen3OmniVisionEncoder,
    read_image_processor_config,
    vision_config,
)

# (width, height): plain, a wide one scaled up to min_pixels, one below it, a larger one, one above max_pixels.
SIZES = [(64, 48), (100, 37), (32, 32), (200, 120), (400, 300)]

pytestmark = OMNI_MARKS


@pytest.fixture(scope="module")
def encoder(model_dir: Path) -> Qwen3OmniVisionEncoder:
    config = json.loads((model_dir / "config.json").read_text())
    reader = WeightReader(model_dir, torch.float32, torch.device("cpu"))
    return Qwen3OmniVisionEncoder(reader.get, config, VISION_PREFIX)


def noise(width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(1000 * width + height)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def images() -> list[Image.Image]:
    return [noise(w, h) for w, h in SIZES]


def reference(hf, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """get_image_features' per-image outputs, concatenated as the thinker does before use."""
    with torch.no_grad():
        out = hf.thinker.get_image_features(pixel_values=pixel_values, image_grid_thw=grid_thw)
    return torch.cat(out.pooler_output), [torch.cat(feature) for feature in out.deepstack_features]


def test_preprocess_equals_the_processor(model_dir: Path, processor) -> None:
    settings = read_image_processor_config(model_dir)
    assert (settings["patch_size"], settings["merge_size"]) == (build.PATCH, build.MERGE) == (16, 2)
    pictures = images()
    pixel_values, grid_thw = preprocess_images(pictures, settings)
    theirs = processor.image_processor(images=pictures, return_tensors="pt")
    assert torch.equal(grid_thw, theirs["image_grid_thw"])
    assert torch.equal(pixel_values, theirs["pixel_values"])  # bitwise
    grids = grid_thw.tolist()
    assert grids[2] == [1, 4, 4]  # 32x32 < min_pixels (64x64): scaled up
    assert grids[4] == [1, 12, 18]  # 416x288 > max_pixels (256x256): scaled down
    # The prompt gets as many <|image_pad|> tokens as image_token_count says.
    for picture in pictures[:2]:
        inputs = processor(text=["<|vision_start|><|image_pad|><|vision_end|>"], images=[picture], return_tensors="pt")
        pads = int((inputs["input_ids"] == build.IMAGE_TOKEN_ID).sum())
        assert pads == image_token_count(picture.width, picture.height, settings)


def test_config_and_shapes(model_dir: Path, encoder: Qwen3OmniVisionEncoder) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert vision_config(config)["deepstack_visual_indexes"] == [0, 1]
    assert (encoder.hidden, encoder.heads, encoder.patch, encoder.merge, encoder.side) == (64, 4, 16, 2, 8)
    grid_thw = torch.tensor([[1, 4, 6]])
    embeddings, deepstack = encoder(torch.zeros(24, 3 * 2 * 16 * 16), grid_thw)
    assert embeddings.shape == (6, 64) and [d.shape for d in deepstack] == [(6, 64)] * 2
    assert encoder.tokens_per_image(grid_thw) == [6]
    empty, empty_deepstack = encoder(torch.zeros(0, 3 * 2 * 16 * 16), torch.zeros(0, 3, dtype=torch.int64))
    assert empty.shape == (0, 64) and [d.shape for d in empty_deepstack] == [(0, 64)] * 2
    with pytest.raises(ValueError, match="pixel_values"):
        encoder(torch.zeros(23, 3 * 2 * 16 * 16), grid_thw)
    with pytest.raises(ValueError, match="blocks"):
        encoder(torch.zeros(15, 3 * 2 * 16 * 16), torch.tensor([[1, 3, 5]]))


def test_one_image_equals_transformers_bitwise(hf, processor, encoder: Qwen3OmniVisionEncoder) -> None:
    for (width, height), picture in zip(SIZES, images()):
        inputs = processor.image_processor(images=[picture], return_tensors="pt")
        pixel_values, grid_thw = inputs["pixel_values"], inputs["image_grid_thw"]
        theirs, their_deepstack = reference(hf, pixel_values, grid_thw)
        ours, our_deepstack = encoder(pixel_values, grid_thw)
        assert ours.shape == theirs.shape == (encoder.tokens_per_image(grid_thw)[0], 64)
        assert torch.equal(ours, theirs), (width, height, (ours - theirs).abs().max().item())
        assert len(our_deepstack) == len(their_deepstack) == 2
        for layer, (mine, reference_feature) in enumerate(zip(our_deepstack, their_deepstack)):
            assert torch.equal(mine, reference_feature), (width, height, layer)
        # The deepstack features are not the embeddings (different mergers, different blocks).
        assert (our_deepstack[0] - ours).abs().max() > 0.1 and (our_deepstack[0] - our_deepstack[1]).abs().max() > 0.1


def test_several_images_in_one_call(hf, processor, encoder: Qwen3OmniVisionEncoder) -> None:
    pictures = images()
    inputs = processor.image_processor(images=pictures, return_tensors="pt")
    pixel_values, grid_thw = inputs["pixel_values"], inputs["image_grid_thw"]
    ours, our_deepstack = encoder(pixel_values, grid_thw)
    counts = encoder.tokens_per_image(grid_thw)
    assert ours.shape == (sum(counts), 64)
    theirs, their_deepstack = reference(hf, pixel_values, grid_thw)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    for mine, reference_feature in zip(our_deepstack, their_deepstack, strict=True):
        torch.testing.assert_close(mine, reference_feature, rtol=1e-5, atol=1e-5)
    # Each image's rows are what it gives alone: attention stays within the image.
    rows = [torch.split(t, counts) for t in (ours, *our_deepstack)]
    for i, picture in enumerate(pictures):
        alone = processor.image_processor(images=[picture], return_tensors="pt")
        embeddings, deepstack = encoder(alone["pixel_values"], alone["image_grid_thw"])
        for batched, single in zip((r[i] for r in rows), (embeddings, *deepstack), strict=True):
            torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-5)
    # Another order gives the same rows, reordered.
    order = [3, 0, 4, 2, 1]
    shuffled = processor.image_processor(images=[pictures[i] for i in order], return_tensors="pt")
    reordered, _ = encoder(shuffled["pixel_values"], shuffled["image_grid_thw"])
    expected = torch.cat([rows[0][i] for i in order])
    torch.testing.assert_close(reordered, expected, rtol=1e-5, atol=1e-5)


def test_frames_and_images_in_one_forward(hf, encoder: Qwen3OmniVisionEncoder) -> None:
    """A 2-frame grid (video-shaped) next to an image: attention within each frame, the same position
    table for each frame, as transformers' encoder does it."""
    grid_thw = torch.tensor([[2, 4, 6], [1, 6, 4]])
    generator = torch.Generator().manual_seed(3)
    pixel_values = torch.randn(2 * 4 * 6 + 6 * 4, 3 * 2 * 16 * 16, generator=generator)
    with torch.no_grad():
        out = hf.thinker.visual(pixel_values, grid_thw=grid_thw)
    ours, deepstack = encoder(pixel_values, grid_thw)
    torch.testing.assert_close(ours, out.pooler_output, rtol=1e-5, atol=1e-5)
    for mine, reference_feature in zip(deepstack, out.deepstack_features, strict=True):
        torch.testing.assert_close(mine, reference_feature, rtol=1e-5, atol=1e-5)
    # The second frame alone (a 1-frame grid) gives the clip's second-frame rows.
    second, _ = encoder(pixel_values[24:48], torch.tensor([[1, 4, 6]]))
    torch.testing.assert_close(ours[6:12], second, rtol=1e-5, atol=1e-5)
