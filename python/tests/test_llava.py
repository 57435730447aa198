"""LLaVA's worker side against transformers: preprocessing equals its CLIP image
processor (PIL backend) for every format and mode; the vision node's features
equal LlavaModel.get_image_features for int and list feature layers, default and
full strategies; bad images fail naming the part; prompt embeddings replace the
image-token rows of a prefill chunk."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from random_llava import IMAGE_TOKEN_ID, make_llava_dir, make_test_images

transformers = pytest.importorskip("transformers")
from PIL import Image  # noqa: E402

from baton_worker.models.llava.graph_model import LlavaGraphModel  # noqa: E402
from baton_worker.models.llava.preprocess import MediaError  # noqa: E402


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("images")
    make_test_images(out)
    return out


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> Path:
    # The "full" strategy over two concatenated layers (test/e2e/vision.test.ts serves both strategies).
    return make_llava_dir("llama", tmp_path_factory.mktemp("llava"), 0, 56, "full", [-1, -3])


def test_pixel_values_equal_transformers(llava: Path, images: Path) -> None:
    model = LlavaGraphModel(llava)
    reference = transformers.CLIPImageProcessorPil.from_pretrained(llava)
    for name in ("a.png", "b.jpg", "c.webp", "d.png", "e.png"):
        data = (images / name).read_bytes()
        ours = model.processing.pixel_values(model.processing.decode(data, name))
        theirs = reference(Image.open(io.BytesIO(data)), return_tensors="np")["pixel_values"][0]
        np.testing.assert_array_equal(ours, theirs, err_msg=name)


def test_image_features_equal_transformers(llava: Path, images: Path) -> None:
    model = LlavaGraphModel(llava)
    vision = model.get_submodule("vision")
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(llava, dtype=torch.float32).eval()
    pixels = torch.from_numpy(np.stack([model.processing.pixel_values(model.processing.decode((images / n).read_bytes(), n)) for n in ("a.png", "c.webp")]))
    with torch.no_grad():
        theirs = hf.model.get_image_features(pixel_values=pixels)
    theirs = getattr(theirs, "pooler_output", theirs)
    theirs = torch.cat([t.reshape(-1, t.shape[-1]) for t in theirs]) if isinstance(theirs, (list, tuple)) else theirs.reshape(-1, theirs.shape[-1])
    ours = vision.image_features(pixels)
    assert ours.shape[1] == model.tokens_per_image()
    torch.testing.assert_close(ours.reshape(-1, ours.shape[-1]), theirs, rtol=1e-5, atol=1e-5)


def test_bad_images_name_their_part(llava: Path, images: Path) -> None:
    model = LlavaGraphModel(llava)
    n = model.tokens_per_image()
    ids = [1, 2] + [IMAGE_TOKEN_ID] * n + [3]
    cases = {
        b"": "the image is empty",
        (images / "truncated.png").read_bytes(): "cannot decode the image",
        (images / "f.gif").read_bytes(): "unsupported image format GIF",
        b"not an image at all": "cannot decode the image",
    }
    for data, says in cases.items():
        with pytest.raises(MediaError, match=rf"^messages\[0\]\.content\[1\]: {says}"):
            model.process_prompt(None, ["text", "image"], ["text"], token_ids=ids, images=[data], image_params=["messages[0].content[1]"], image_token_counts=[n])
    with pytest.raises(MediaError, match="image tokens"):
        good = (images / "a.png").read_bytes()
        model.process_prompt(None, ["text", "image"], ["text"], token_ids=ids[:-3], images=[good], image_params=["p"], image_token_counts=[n])
