"""Qwen3-Omni's thinker through the worker's path against transformers' thinker.generate: the graph
model's process_prompt (audio decoded from WAV bytes into log-mel features, images into patches, each
placeholder expanded to its part's tokens, the multimodal rotary positions), the encoder node's one
batched forward over every request's clips and images (audio rows, image rows with their deepstack
features, in prompt order), and the mixture-of-experts text model in the StepRunner with those rows in
place of the <|audio_pad|> / <|image_pad|> embeddings (AddedRequest.embeds) and the positions
(AddedRequest.positions): greedy tokens equal transformers' for text, audio, image and mixed prompts,
with prefill chunks cutting through the clips and images and decodes sharing steps with prefills."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_omni_moe")
from PIL import Image  # noqa: E402

from engine_sim import EngineSim, SimRequest  # noqa: E402
from qwen3_omni_fixtures import OMNI_MARKS, hf, model_dir, processor  # noqa: E402,F401  (fixtures)
from baton_worker.models.qwen3_omni import build  # noqa: E402
from baton_worker.models.qwen3_omni.graph_model import (  # noqa: E402
    AUDIO_TOKEN_ID,
    IMAGE_TOKEN_ID,
    MM_EMBEDS,
    NUM_PROMPT_TOKENS,
    POSITIONS,
    TEXT_INPUTS,
    Qwen3OmniGraphModel,
)
from baton_worker.models.vision_language import MediaError  # noqa: E402
from baton_worker.protocol import SamplingParams  # noqa: E402
from baton_worker.runtime.loading import load_worker  # noqa: E402
from baton_worker.runtime.options import WorkerOptions  # noqa: E402

NEW_TOKENS = 10

pytestmark = OMNI_MARKS


def _clip(seconds: float, seed: int) -> np.ndarray:
    """16-bit samples as float32 (what decoding the WAV gives back exactly)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * build.AUDIO_SAMPLE_RATE)) / build.AUDIO_SAMPLE_RATE
    x = 0.3 * np.sin(2 * np.pi * (200 + 100 * seed) * t) + 0.05 * rng.standard_normal(t.shape)
    return (np.round(x * 32767) / 32768).astype(np.float32)


def _wav(clip: np.ndarray) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(build.AUDIO_SAMPLE_RATE)
        w.writeframes((clip * 32768).astype("<i2").tobytes())
    return out.getvalue()


def _image(width: int, height: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


# Each case: content parts of one user turn, in order.
CASES = [
    [{"type": "text", "text": "Say something short."}],
    [{"type": "audio", "audio": _clip(1.3, 0)}, {"type": "text", "text": "What is this sound?"}],
    [{"type": "image", "image": _image(64, 96, 1)}, {"type": "text", "text": "Describe it."}],
    # Two clips (each over 1 s: transformers pads a prompt's clips to its longest chunk) around an image.
    [
        {"type": "text", "text": "First:"},
        {"type": "audio", "audio": _clip(1.1, 2)},
        {"type": "image", "image": _image(96, 64, 3)},
        {"type": "audio", "audio": _clip(2.4, 4)},
        {"type": "text", "text": "Compare them."},
    ],
]


def _single_placeholders(ids: list[int]) -> list[int]:
    """The processor's prompt with every run of audio or image tokens cut to one token: what the frontend sends."""
    out = []
    for token in ids:
        if token in (AUDIO_TOKEN_ID, IMAGE_TOKEN_ID) and out and out[-1] == token:
            continue
        out.append(token)
    return out


def test_multimodal_prompts_equal_transformers(model_dir, hf, processor):
    worker = load_worker(WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=256,
                                       dtype="float32", device="cpu"))
    assert [(n["name"], n["engine"]) for n in worker.ready.graph["nodes"]] == [("encoder", "stateless"), ("thinker", "kv_cache")]
    assert worker.config.moe is not None and any(worker.config.moe.sparse_layers), "the thinker has expert layers"
    model = Qwen3OmniGraphModel(model_dir)
    nodes = worker.graph_runner.nodes
    encoder = nodes.submodules["encoder"]

    values, expected, full_ids = [], [], []
    for content in CASES:
        messages = [{"role": "user", "content": content}]
        inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                               return_tensors="pt")
        ids = inputs["input_ids"][0].tolist()
        full_ids.append(ids)
        with torch.no_grad():
            out = hf.thinker.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        expected.append(out[0, len(ids):].tolist())
        audios = [_wav(p["audio"]) for p in content if p["type"] == "audio"]
        images = [_png(p["image"]) for p in content if p["type"] == "image"]
        values.append(model.process_prompt(None, ["text", "audio", "image"], ["text"], token_ids=_single_placeholders(ids),
                                           audios=audios, images=images))
    for v, ids in zip(values, full_ids):
        assert v[TEXT_INPUTS][0].tolist() == ids, "placeholders expand to the processor's counts"
        assert int(v[NUM_PROMPT_TOKENS][0][0]) == len(ids)

    # One encoder forward for every request's clips and images, as a step's batch of passes.
    prepared = [{name: v.get(name, []) for name in model.encoder_inputs} for v in values]
    rows = encoder.forward("encode", [None] * len(prepared), encoder.preprocess("encode", [None] * len(prepared), prepared))
    store = nodes.store
    requests = []
    for i, (v, ids, r) in enumerate(zip(values, full_ids, rows)):
        mm = r[MM_EMBEDS][0]
        assert mm.shape[0] == sum(t in (AUDIO_TOKEN_ID, IMAGE_TOKEN_ID) for t in ids)
        requests.append(SimRequest(i, ids, NEW_TOKENS, SamplingParams(temperature=0.0), arrive_step=i,
                                   embeds=store.put(mm).handle, positions=store.put(v[POSITIONS][0]).handle))
    # 7 tokens a step: prefill chunks cut through the clips and images; decodes share steps with prefills.
    sim = EngineSim(worker.runner, 4, 256, token_budget=7, seed=2)
    sim.run(requests)
    assert [r.output for r in requests] == expected
    assert all(len(set(out)) > 3 for out in expected), "the random thinker should vary its tokens"


def test_prompts_are_checked(model_dir):
    model = Qwen3OmniGraphModel(model_dir)
    with pytest.raises(MediaError, match="1 audio placeholders for 0 audio parts"):
        model.process_prompt(None, [], [], token_ids=[1, AUDIO_TOKEN_ID, 2])
    with pytest.raises(MediaError, match="0 image placeholders for 1 images"):
        model.process_prompt(None, [], [], token_ids=[1, 2], images=[_png(_image(32, 32, 0))])
    with pytest.raises(ValueError, match="messages\\[0\\].content\\[1\\]: not a readable audio file"):
        model.process_prompt(None, [], [], token_ids=[AUDIO_TOKEN_ID], audios=[b"RIFF not audio"],
                             audio_params=["messages[0].content[1]"])
    with pytest.raises(MediaError, match="image 0: cannot decode the image"):
        model.process_prompt(None, [], [], token_ids=[IMAGE_TOKEN_ID], images=[b"\x89PNG broken"])
