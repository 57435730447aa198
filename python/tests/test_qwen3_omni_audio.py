"""Qwen3-Omni's audio input (baton_worker.models.qwen3_omni.audio) against transformers, on the tiny
random-weight directory (baton_worker.models.qwen3_omni.build) in float32 on CPU, for clips of 0.5 s,
1 s, 3.7 s and 12 s (sines and noise at 16 kHz) and one whose length is no multiple of the 160-sample hop:

- features: AudioFeatures (Whisper's log-mel of whisper/features.py) gives each clip the processor's
  input_features bit for bit (the frames its feature_attention_mask keeps);
- token counts: num_audio_tokens_for_samples / num_audio_tokens equal the <|audio_pad|> tokens the
  processor puts in a chat prompt, for each clip alone and for all clips in one prompt;
- the encoder, read from the directory with the full model's `thinker.audio_tower.` names, gives
  transformers' get_audio_features embeddings bit for bit for each clip alone, and all clips batched in
  one call give each clip those same bits (windows of one length share an SDPA call here: two 12 s clips).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_omni_moe")

from baton_worker.model.weights import WeightReader  # noqa: E402
from baton_worker.models.qwen3_omni import build  # noqa: E402
from baton_worker.models.qwen3_omni.audio import (  # noqa: E402
    AudioFeatures,
    Qwen3OmniAudioEncoder,
    num_audio_tokens,
    num_audio_tokens_for_samples,
    processor_features,
)
from qwen3_omni_fixtures import OMNI_MARKS, TOKENIZER_DIR, hf, model_dir, processor  # noqa: E402,F401  (fixtures)

RATE = build.AUDIO_SAMPLE_RATE

pytestmark = OMNI_MARKS


def _sine(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def _noise(seconds: float, seed: int) -> np.ndarray:
    return (0.3 * np.random.RandomState(seed).randn(round(seconds * RATE))).astype(np.float32)


# name -> (clip, <|audio_pad|> tokens): 13 per full second (100 frames) plus the rest's three stride-2 convs.
CLIPS = {
    "0.5s-sine": (_sine(0.5, 440.0), 7),
    "1s-noise": (_noise(1.0, 0), 13),
    "3.7s-sine": (_sine(3.7, 220.0), 48),  # 370 frames: 3 x 13 + 9 (70 -> 35 -> 18 -> 9)
    "12s-noise": (_noise(12.0, 1), 156),  # 1200 frames: 156 tokens, attention windows of 104 + 52
    "12s-sine": (_sine(12.0, 330.0), 156),
    "1.2345s-sine": (_sine(1.2345, 500.0), 16),  # 19752 samples: 123 frames (the hop does not divide it)
}


@pytest.fixture(scope="module")
def encoder(model_dir: Path) -> Qwen3OmniAudioEncoder:
    reader = WeightReader(model_dir, torch.float32, torch.device("cpu"))
    return Qwen3OmniAudioEncoder(reader.get, json.loads((model_dir / "config.json").read_text()))


def chat(processor, *clips: np.ndarray):
    content = [*({"type": "audio", "audio": clip} for clip in clips), {"type": "text", "text": "What is this?"}]
    return processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )


@pytest.fixture(scope="module")
def reference(hf, processor) -> dict:
    """name -> (the clip's chat inputs alone, transformers' audio embeddings for it)."""
    out = {}
    for name, (clip, _) in CLIPS.items():
        inputs = chat(processor, clip)
        with torch.no_grad():
            embeds = hf.thinker.get_audio_features(
                inputs["input_features"], feature_attention_mask=inputs["feature_attention_mask"]
            ).last_hidden_state
        out[name] = (inputs, embeds)
    return out


@pytest.mark.parametrize("name", list(CLIPS))
def test_features_and_token_count(name: str, model_dir: Path, processor, reference):
    clip, tokens = CLIPS[name]
    inputs, embeds = reference[name]
    mask = inputs["feature_attention_mask"]
    assert mask.shape[0] == 1 and bool(mask.all())  # one clip alone: no padding
    frames = int(mask.sum())
    assert frames == len(clip) // 160
    ours = AudioFeatures.from_dir(model_dir)([clip])
    assert len(ours) == 1 and torch.equal(ours[0], processor_features(inputs["input_features"], mask)[0])
    pads = int((inputs["input_ids"] == build.AUDIO_TOKEN_ID).sum())
    assert pads == tokens == embeds.shape[0]
    assert num_audio_tokens_for_samples(len(clip)) == num_audio_tokens(frames) == pads


@pytest.mark.parametrize("name", list(CLIPS))
def test_one_clip_is_transformers_bits(name: str, encoder, reference):
    inputs, embeds = reference[name]
    ours = encoder(processor_features(inputs["input_features"], inputs["feature_attention_mask"]))
    assert ours.shape == embeds.shape == (CLIPS[name][1], build.THINKER_HIDDEN)
    assert torch.equal(ours, embeds)


def test_clips_batched_in_one_call(encoder, reference, model_dir: Path):
    names = list(CLIPS)
    features = [processor_features(reference[n][0]["input_features"], reference[n][0]["feature_attention_mask"])[0] for n in names]
    batched = encoder(features)
    rows = batched.split([CLIPS[n][1] for n in names])
    assert batched.shape[0] == sum(CLIPS[n][1] for n in names)
    for name, ours in zip(names, rows):
        assert torch.equal(ours, reference[name][1]), name
    # Another order gives each clip the same rows again; our own features give the same as the processor's.
    again = encoder(AudioFeatures.from_dir(model_dir)([CLIPS[n][0] for n in reversed(names)]))
    for name, ours in zip(reversed(names), again.split([CLIPS[n][1] for n in reversed(names)])):
        assert torch.equal(ours, reference[name][1]), name


def test_all_clips_in_one_prompt(encoder, processor):
    """The processor pads a prompt's clips to the longest: the counts still follow each clip's mask."""
    clips = [clip for clip, _ in CLIPS.values()]
    inputs = chat(processor, *clips)
    mask = inputs["feature_attention_mask"]
    frames = mask.sum(-1).tolist()
    pads = int((inputs["input_ids"] == build.AUDIO_TOKEN_ID).sum())
    assert pads == sum(num_audio_tokens(n) for n in frames)
    assert encoder(processor_features(inputs["input_features"], mask)).shape == (pads, build.THINKER_HIDDEN)


def test_edges(encoder):
    assert encoder([]).shape == (0, build.THINKER_HIDDEN)
    with pytest.raises(ValueError, match="128"):
        encoder([torch.zeros(80, 100)])
    # Chunk arithmetic: 100 frames -> 13 tokens; a remainder of r frames -> its three stride-2 convs.
    assert [num_audio_tokens(n) for n in (0, 1, 2, 8, 9, 99, 100, 101, 200, 1200)] == [0, 1, 1, 1, 2, 13, 13, 14, 26, 156]
    # The processor's own count, for every length up to 50 s.
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    frames = torch.arange(5001)
    assert _get_feat_extract_output_lengths(frames).tolist() == [num_audio_tokens(n) for n in range(5001)]
