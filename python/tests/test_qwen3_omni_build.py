"""The tiny Qwen3-Omni directory (baton_worker.models.qwen3_omni.build) with transformers'
Qwen3OmniMoeForConditionalGeneration and Qwen3OmniMoeProcessor, on CPU in float32:

- the directory has Qwen3-Omni's layout and ids: config.json with the thinker (audio encoder, vision
  encoder, MoE text model), the talker (MoE text model, code predictor) and code2wav, weights under
  thinker.*, talker.* and code2wav.* (experts stored one by one, as the hub's checkpoints are), the
  tokenizer's Qwen3-Omni specials at the config's ids, the processor's chat template;
- the thinker's greedy text varies (a text chat, a chat with a 64x48 image, one with a second of a sine at
  16 kHz), and the image and the audio change it;
- speech: generate(return_audio=True) with the default speaker gives a waveform that ends on codec_eos the
  step after the text runs out (one 12.5 Hz frame per text token but the last), greedy or sampled, at
  speech-like levels; another speaker gives other speech;
- the weights follow the seed, and the command line prints the directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_omni_moe")

from baton_worker.models.qwen3_omni import build  # noqa: E402
from qwen3_omni_fixtures import OMNI_MARKS, TOKENIZER_DIR, hf, model_dir, processor  # noqa: E402,F401  (fixtures)

FRAME_SAMPLES = 1920  # 24 kHz / 12.5 Hz
DECODER_TRIM = 555  # code2wav's trimmed transposed convs: T frames -> ((((4T - 1) * 8 - 1) * 5 - 1) * 4 - 1) * 3 samples

pytestmark = OMNI_MARKS


def image(seed: int):
    from PIL import Image

    return Image.fromarray((np.random.RandomState(seed).rand(48, 64, 3) * 255).astype(np.uint8))


def sine(hz: float, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(seconds * build.AUDIO_SAMPLE_RATE)) / build.AUDIO_SAMPLE_RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def chat(processor, *parts):
    content = [*parts, {"type": "text", "text": "Tell me about it."}]
    return processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )


def thinker_tokens(hf, inputs, n: int = 16) -> list[int]:
    with torch.no_grad():
        out = hf.thinker.generate(**inputs, max_new_tokens=n, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def test_directory_layout_and_ids(model_dir: Path, hf, processor):
    assert {p.name for p in model_dir.iterdir()} >= {
        "config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "processor_config.json", "chat_template.jinja",
    }  # fmt: skip
    config = hf.config
    assert config.enable_audio_output and hf.has_talker
    thinker, talker = config.thinker_config, config.talker_config
    text = thinker.text_config
    sizes = (text.vocab_size, text.hidden_size, text.num_hidden_layers, text.num_experts, text.num_experts_per_tok)
    assert sizes == (152064, 64, 2, 8, 2) and text.mlp_only_layers == [0]
    assert thinker.audio_config.num_mel_bins == processor.feature_extractor.feature_size == 128
    assert processor.feature_extractor.sampling_rate == build.AUDIO_SAMPLE_RATE
    vision = thinker.vision_config
    assert all(0 <= i < vision.depth for i in vision.deepstack_visual_indexes)
    images = processor.image_processor
    assert (vision.patch_size, vision.spatial_merge_size) == (images.patch_size, images.merge_size)
    assert talker.num_code_groups == talker.code_predictor_config.num_code_groups == config.code2wav_config.num_quantizers
    assert talker.speaker_id == build.SPEAKERS and talker.text_config.vocab_size == 3072

    # Layer 0 of the thinker's text model is dense, layer 1 a mixture of experts; both in the hub's names.
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {n.split(".")[0] for n in names} == {"thinker", "talker", "code2wav"}
    assert {".".join(n.split(".")[:2]) for n in names if not n.startswith("code2wav")} == {
        "thinker.audio_tower", "thinker.visual", "thinker.model", "thinker.lm_head",
        "talker.model", "talker.text_projection", "talker.hidden_projection", "talker.codec_head", "talker.code_predictor",
    }  # fmt: skip
    assert "thinker.model.layers.0.mlp.gate_proj.weight" in names
    assert {"thinker.model.layers.1.mlp.gate.weight", "thinker.model.layers.1.mlp.experts.7.down_proj.weight"} <= names
    assert "talker.model.layers.0.mlp.shared_expert_gate.weight" in names

    # The tokenizer has Qwen3-Omni's specials at the config's ids, and the processor names them.
    tokenizer = processor.tokenizer
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in build.OMNI_SPECIAL_TOKENS.values()}
    assert ids == {token: i for i, token in build.OMNI_SPECIAL_TOKENS.items()}
    assert tokenizer.convert_tokens_to_ids(processor.audio_token) == thinker.audio_token_id == talker.audio_token_id
    assert tokenizer.convert_tokens_to_ids(processor.image_token) == thinker.image_token_id
    assert tokenizer.convert_tokens_to_ids(processor.video_token) == thinker.video_token_id
    assert tokenizer.convert_tokens_to_ids(processor.audio_bos_token) == thinker.audio_start_token_id
    assert tokenizer.convert_tokens_to_ids(processor.vision_bos_token) == thinker.vision_start_token_id
    assert [tokenizer.convert_tokens_to_ids(t) for t in ("<tts_pad>", "<tts_text_bos>", "<tts_text_eod>")] == [
        config.tts_pad_token_id, config.tts_bos_token_id, config.tts_eos_token_id,
    ]  # fmt: skip
    assert tokenizer.encode("user") == [config.user_token_id]
    assert tokenizer.encode("assistant") == [config.assistant_token_id]
    assert hf.generation_config.eos_token_id == [151645, 151643]


def test_text_chat_greedy_varies(hf, processor):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Tell me a story about a robot."}]}]
    assert processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>user\nTell me a story about a robot.<|im_end|>\n<|im_start|>assistant\n"
    )
    inputs = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    tokens = thinker_tokens(hf, inputs)
    assert len(tokens) == 16 and len(set(tokens)) >= 5
    # The whole model's generate without audio is the thinker's.
    with torch.no_grad():
        sequences = hf.generate(**inputs, return_audio=False, thinker_max_new_tokens=16, thinker_do_sample=False)
    assert sequences[0, inputs["input_ids"].shape[1] :].tolist() == tokens


def test_image_chat(hf, processor):
    inputs = chat(processor, {"type": "image", "image": image(0)})
    # 64x48 pixels -> 64x64 (multiples of 32) -> 4x4 patches of 16 -> 2x2 merged tokens.
    assert inputs["image_grid_thw"].tolist() == [[1, 4, 4]]
    ids = inputs["input_ids"][0].tolist()
    start = ids.index(build.VISION_START_ID)
    assert ids[start : start + 6] == [build.VISION_START_ID] + [build.IMAGE_TOKEN_ID] * 4 + [build.VISION_END_ID]
    tokens = thinker_tokens(hf, inputs)
    assert len(set(tokens)) >= 5
    assert thinker_tokens(hf, chat(processor, {"type": "image", "image": image(1)})) != tokens


def test_audio_chat(hf, processor):
    inputs = chat(processor, {"type": "audio", "audio": sine(440.0)})
    # One second: 100 mel frames -> 13 audio tokens.
    assert inputs["input_features"].shape == (1, 128, 100) and inputs["feature_attention_mask"].sum() == 100
    ids = inputs["input_ids"][0].tolist()
    start = ids.index(build.AUDIO_START_ID)
    assert ids[start : start + 15] == [build.AUDIO_START_ID] + [build.AUDIO_TOKEN_ID] * 13 + [build.AUDIO_END_ID]
    tokens = thinker_tokens(hf, inputs)
    assert len(set(tokens)) >= 5
    assert thinker_tokens(hf, chat(processor, {"type": "audio", "audio": sine(220.0)})) != tokens


def _speak(hf, inputs, n: int, **kwargs):
    with torch.no_grad():
        sequences, wav = hf.generate(
            **inputs, return_audio=True, thinker_max_new_tokens=n, thinker_do_sample=False, talker_max_new_tokens=4 * n, **kwargs
        )
    assert sequences.shape[1] == inputs["input_ids"].shape[1] + n
    return wav.reshape(-1)


@pytest.mark.parametrize("n", [8, 16])
def test_speech_ends_after_the_text(hf, processor, n: int):
    inputs = chat(processor)
    wav = _speak(hf, inputs, n, talker_do_sample=False)
    # The talker speaks the text token by token (the last generated one has no thinker embedding yet) and
    # ends on codec_eos the step after: n - 1 frames, far fewer than talker_max_new_tokens.
    assert wav.numel() == (n - 1) * FRAME_SAMPLES - DECODER_TRIM
    assert torch.isfinite(wav).all() and 0.02 < wav.std() < 0.3 and wav.abs().max() < 0.9
    torch.manual_seed(0)
    sampled = _speak(hf, inputs, n)  # transformers' default talker sampling (top-k 50, temperature 0.9)
    assert sampled.numel() == wav.numel() and not torch.equal(sampled, wav)
    assert not torch.equal(_speak(hf, inputs, n, talker_do_sample=False, speaker="Chelsie"), wav)


def test_speech_with_an_image(hf, processor):
    wav = _speak(hf, chat(processor, {"type": "image", "image": image(0)}), 8, talker_do_sample=False)
    assert wav.numel() == 7 * FRAME_SAMPLES - DECODER_TRIM


def test_seed_and_command_line(model_dir: Path, tmp_path: Path, capsys):
    assert build.main(["--out", str(tmp_path / "same"), "--seed", "0"]) == 0
    assert json.loads(capsys.readouterr().out) == {"model_dir": str(tmp_path / "same")}
    assert (tmp_path / "same" / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert not (tmp_path / "same" / "tokenizer.json").exists()

    shutil.rmtree(tmp_path / "same")

    from safetensors.torch import load_file

    other = load_file(build.make_qwen3_omni_dir(tmp_path / "other", seed=1) / "model.safetensors")
    shutil.rmtree(tmp_path / "other")
    same = load_file(model_dir / "model.safetensors")
    assert other.keys() == same.keys()
    for name in ("thinker.model.embed_tokens.weight", "talker.codec_head.weight", "code2wav.code_embedding.weight"):
        assert not torch.equal(other[name], same[name])
