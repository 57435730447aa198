"""The tiny CSM directory (baton_worker.models.csm.build) and the plain-PyTorch
reference loop (baton_worker.models.csm.reference) against transformers, on
CPU in float32:

- the directory loads as CsmForConditionalGeneration and CsmProcessor, and the
  processor lays prompts out as csm-1b's does (a turn is
  <|begin_of_text|>[speaker]text<|end_of_text|>; a context turn adds one
  <|AUDIO|> per codec frame and <|audio_eos|>); the reference's llama3 RoPE
  frequencies are transformers';
- greedy codes of the reference equal CsmForConditionalGeneration.generate's
  for both speakers, with and without a context utterance (a sine wave the
  processor and the codec turn into frames), frame for frame, including the
  end-of-stream frame the generation stops on; generations last tens of
  frames, frames differ, and they differ between speakers;
- with the same torch seed, sampled codes (csm-1b's temperature 0.9, top-k 50
  at both levels) equal transformers' too.

The directory's generation config samples in the depth decoder
(depth_decoder_do_sample), so transformers' greedy run names it as well.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from csm_fixtures import CONVERSATIONS, CSM_MARKS, context_codes, hf, model_dir  # noqa: F401  (fixtures)

transformers = pytest.importorskip("transformers")

from baton_worker.models.csm.build import AUDIO_EOS_TOKEN_ID, AUDIO_TOKEN_ID, BOS_TOKEN_ID, EOS_TOKEN_ID, NUM_CODEBOOKS  # noqa: E402
from baton_worker.models.csm.reference import CsmReference, _llama3_inv_freq, _rope_parameters, generate_codes  # noqa: E402

MAX_FRAMES = 80

pytestmark = CSM_MARKS


@pytest.fixture(scope="module")
def processor(model_dir: Path):
    return transformers.CsmProcessor.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> CsmReference:
    return CsmReference(model_dir)


def _inputs(processor, name: str):
    return processor.apply_chat_template(CONVERSATIONS[name], tokenize=True, return_dict=True)


def _hf_codes(hf, inputs, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return hf.generate(**inputs, max_new_tokens=MAX_FRAMES, output_audio=False, **kwargs)[0]


def test_directory_loads_with_csm_1b_layout(model_dir: Path, processor, hf):
    assert hf.config.num_codebooks == NUM_CODEBOOKS
    assert hf.codec_model.config.num_quantizers == NUM_CODEBOOKS
    assert {p.name for p in model_dir.iterdir()} >= {
        "config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "chat_template.jinja", "preprocessor_config.json",
    }
    assert hf.generation_config.do_sample and hf.generation_config.temperature == 0.9 and hf.generation_config.top_k == 50
    assert hf.generation_config.max_new_tokens == 125
    plain = processor("[0]Hello from Sesame.", add_special_tokens=True)["input_ids"][0].tolist()
    templated = _inputs(processor, "speaker0")["input_ids"][0].tolist()
    assert plain == templated
    assert templated[0] == BOS_TOKEN_ID and templated[-1] == EOS_TOKEN_ID
    assert processor.tokenizer.decode(templated[1:-1]) == "[0]Hello from Sesame."

    inputs = _inputs(processor, "context")
    ids = inputs["input_ids"][0]
    codes = context_codes(hf, inputs)
    audio = (ids == AUDIO_TOKEN_ID).nonzero()[:, 0]
    # One <|AUDIO|> per codec frame (0.8 s at 12.5 frames/s), contiguous, right after the first turn's text.
    assert len(audio) == codes.shape[0] == 10
    assert ids[audio[0] - 1] == EOS_TOKEN_ID and ids[audio[-1] + 1] == AUDIO_EOS_TOKEN_ID and ids[audio[-1] + 2] == BOS_TOKEN_ID
    assert int(codes.max()) < 2048 and len({tuple(r) for r in codes.tolist()}) > 1


def test_rope_frequencies_equal_transformers(model_dir: Path, hf):
    config = json.loads((model_dir / "config.json").read_text())
    for stack, rotary in ((config, hf.backbone_model.rotary_emb), (config["depth_decoder_config"], hf.depth_decoder.model.rotary_emb)):
        ours = _llama3_inv_freq(_rope_parameters(stack), stack["head_dim"])
        assert torch.equal(ours, rotary.inv_freq)
        # csm-1b's own config.json spells the same settings as rope_theta + rope_scaling.
        rope = dict(stack["rope_parameters"])
        legacy = {"rope_theta": rope.pop("rope_theta"), "rope_scaling": rope}
        assert torch.equal(_llama3_inv_freq(_rope_parameters(legacy), stack["head_dim"]), ours)


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_greedy_codes_equal_transformers(name: str, processor, hf, reference: CsmReference):
    inputs = _inputs(processor, name)
    expected = _hf_codes(hf, inputs, do_sample=False, depth_decoder_do_sample=False)
    got = reference.generate(inputs["input_ids"][0], MAX_FRAMES, context_codes(hf, inputs))
    assert got.shape == expected.shape and torch.equal(got, expected)
    # Several frames, different from each other, ended by an end-of-stream frame before the cap.
    assert 10 <= got.shape[0] < MAX_FRAMES
    assert bool((got[-1, :-1] == 0).all())
    assert len({tuple(r) for r in got[:-1].tolist()}) == got.shape[0] - 1
    assert int(got.max()) < 2048


def test_codes_vary_with_speaker(model_dir: Path, processor):
    codes = [
        generate_codes(model_dir, _inputs(processor, name)["input_ids"][0], MAX_FRAMES)
        for name in ("speaker0", "speaker1")
    ]
    n = min(len(c) for c in codes)
    assert not torch.equal(codes[0][:n], codes[1][:n])


@pytest.mark.parametrize("seed", [0, 1])
def test_seeded_sampling_equals_transformers(seed: int, processor, hf, reference: CsmReference):
    inputs = _inputs(processor, "context")
    torch.manual_seed(seed)
    expected = _hf_codes(hf, inputs, do_sample=True, depth_decoder_do_sample=True)
    context = context_codes(hf, inputs)
    torch.manual_seed(seed)
    got = reference.generate(inputs["input_ids"][0], MAX_FRAMES, context, do_sample=True)
    assert got.shape == expected.shape and torch.equal(got, expected)
    # A private generator gives the same draws as the global one from the same seed.
    again = reference.generate(inputs["input_ids"][0], MAX_FRAMES, context, do_sample=True, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(again, got)
