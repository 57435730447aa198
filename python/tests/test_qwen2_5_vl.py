"""Qwen2.5-VL through the worker's path against transformers' generate: the
graph model's process_prompt (preprocessing, the prompt's multimodal rotary
positions), the vision node's batched forward, and the text model in the
StepRunner with the image features replacing the <|image_pad|> embeddings
(AddedRequest.embeds) and the (t, h, w) positions (AddedRequest.positions):
greedy tokens equal transformers' for prompts with several images of
different sizes, with chunked prefill cutting through the images."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from engine_sim import EngineSim, SimRequest
from baton_worker.models.qwen2_5_vl.build import IMAGE_TOKEN_ID, VISION_END_ID, VISION_START_ID, make_qwen2_5_vl_dir

transformers = pytest.importorskip("transformers")
from PIL import Image  # noqa: E402

from baton_worker.models.vision_language import MediaError  # noqa: E402
from baton_worker.models.qwen2_5_vl.graph_model import IMAGE_GRID, PIXEL_VALUES, POSITIONS, Qwen25VLGraphModel, rope_positions  # noqa: E402
from baton_worker.protocol import ProtocolError, SamplingParams  # noqa: E402
from baton_worker.runtime.loading import load_worker  # noqa: E402
from baton_worker.runtime.options import WorkerOptions  # noqa: E402

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_qwen2_5_vl_dir(tmp_path_factory.mktemp("qwen-vl") / "m")


def _png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _prompt(model: Qwen25VLGraphModel, sizes: list[tuple[int, int]], text: list[list[int]]) -> list[int]:
    """text[0] <image 0> text[1] <image 1> ... text[-1], each image as <|vision_start|> pads <|vision_end|>."""
    ids = list(text[0])
    for (w, h), after in zip(sizes, text[1:]):
        ids += [VISION_START_ID] + [IMAGE_TOKEN_ID] * model.tokens_for_image(w, h) + [VISION_END_ID] + list(after)
    return ids


def _hf_greedy(model_dir, hf, ids: list[int], images: list[bytes]) -> list[int]:
    processor = transformers.Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    kwargs = {}
    if images:
        inputs = processor([Image.open(io.BytesIO(b)) for b in images], return_tensors="pt")
        kwargs = {"pixel_values": inputs["pixel_values"], "image_grid_thw": inputs["image_grid_thw"]}
    input_ids = torch.tensor([ids])
    kwargs["mm_token_type_ids"] = (input_ids == IMAGE_TOKEN_ID).int()
    with torch.no_grad():
        out = hf.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                          min_new_tokens=NEW_TOKENS, **kwargs)
    return out[0, len(ids):].tolist()


def test_greedy_equals_transformers_with_images_of_several_sizes(model_dir):
    model = Qwen25VLGraphModel(model_dir)
    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    cases = [
        ([(56, 56)], [[9707, 11], [3838, 374]]),  # one small image
        ([(140, 84), (70, 196)], [[40, 1079], [323], [3838]]),  # two images, text between: positions continue after each
        ([], [[9707, 1879, 11, 220, 17]]),  # text only
        ([(112, 112), (56, 84), (168, 56)], [[16], [17], [18], [19, 20]]),
    ]
    loaded = load_worker(WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=512, dtype="float32",
                                     device="cpu"))  # on a GPU the vision node runs in bfloat16
    kv, nodes = loaded.runner, loaded.graph_runner.nodes
    store, vision = nodes.store, nodes.submodules["vision"]
    requests, expected = [], []
    for i, (sizes, text) in enumerate(cases):
        images = [_png(w, h, seed=10 * i + j) for j, (w, h) in enumerate(sizes)]
        ids = _prompt(model, sizes, text)
        values = model.process_prompt(None, ["text", "image"], ["text"], token_ids=ids, images=images)
        if sizes:
            rows = vision.tower(values[PIXEL_VALUES][0], values[IMAGE_GRID][0])
        else:
            rows = torch.zeros(0, vision.tower.out_hidden)
        embeds = store.put(rows).handle
        positions = store.put(values[POSITIONS][0]).handle
        requests.append(SimRequest(i, ids, NEW_TOKENS, SamplingParams(temperature=0.0), arrive_step=i, embeds=embeds, positions=positions))
        expected.append(_hf_greedy(model_dir, hf, ids, images))
    # A budget of 7 tokens a step: prefill chunks cut through every image, and decodes share steps with prefills.
    sim = EngineSim(kv, 4, 512, token_budget=7, seed=1)
    sim.run(requests)
    assert [r.output for r in requests] == expected
    assert any(len(set(out)) > 3 for out in expected)  # the random model's output varies


def test_rope_positions_equal_transformers(model_dir):
    model = Qwen25VLGraphModel(model_dir)
    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    sizes = [(140, 84), (70, 196)]
    ids = _prompt(model, sizes, [[1, 2], [3], [4, 5, 6]])
    grids = torch.tensor([[1, *_grid(model, w, h)] for w, h in sizes])
    input_ids = torch.tensor([ids])
    theirs, delta = hf.model.get_rope_index(input_ids, (input_ids == IMAGE_TOKEN_ID).int(), image_grid_thw=grids)
    ours = rope_positions(np.asarray(ids), grids.numpy(), IMAGE_TOKEN_ID, 2)
    np.testing.assert_array_equal(ours, theirs[:, 0].numpy())
    assert int(ours.max()) + 1 - len(ids) == int(delta)


def _grid(model: Qwen25VLGraphModel, width: int, height: int) -> tuple[int, int]:
    from baton_worker.models.qwen2_5_vl.preprocess import smart_resize

    cfg = model.processing
    factor = cfg["patch_size"] * cfg["merge_size"]
    h, w = smart_resize(height, width, factor, cfg["min_pixels"], cfg["max_pixels"])
    return h // cfg["patch_size"], w // cfg["patch_size"]


def test_prompt_and_positions_are_checked(model_dir):
    model = Qwen25VLGraphModel(model_dir)
    ids = _prompt(model, [(56, 56)], [[1], [2]])
    with pytest.raises(MediaError, match="image 0: cannot decode the image"):
        model.process_prompt(None, [], [], token_ids=ids, images=[b"not a png"])
    with pytest.raises(MediaError, match="1 images but 0 image-token runs"):
        model.process_prompt(None, [], [], token_ids=[1, 2, 3], images=[_png(56, 56, 0)])
    with pytest.raises(MediaError, match="a run of 5 image tokens for 4 features"):
        model.process_prompt(None, [], [], token_ids=[1] + [IMAGE_TOKEN_ID] * 5, images=[_png(56, 56, 0)])
    # A worker whose model has no multimodal rotary refuses AddedRequest.positions.
    loaded = load_worker(WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=64, dtype="float32"))
    kv, store = loaded.runner, loaded.graph_runner.nodes.store
    bad = store.put(torch.zeros(3, 2, dtype=torch.int64)).handle
    sim = EngineSim(kv, 4, 64, token_budget=8)
    with pytest.raises(ProtocolError, match=r"positions: an int64 tensor \[3, 3\] was expected, got torch.int64 \(3, 2\)"):
        sim.run([SimRequest(0, [1, 2, 3], 2, SamplingParams(temperature=0.0), positions=bad)])
