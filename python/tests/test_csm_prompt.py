"""CsmPrompter (baton_worker.models.csm.prompt) against transformers on the tiny random CSM directory:

- for every fixture conversation (and one with two clips), its context audio sent as WAV bytes gives the processor's
  input_ids and prompt_frames over the codes CsmForConditionalGeneration's codec gives. The
  reference runs on the samples the WAV decodes to (the int16 round trip moves them by up to
  half a step), so the comparison is exact;
- greedy generation from those inputs (transformers' generate) equals reference.generate_codes
  from the prompter's ids and context codes;
- the prompter's codec holds the checkpoint's codec weights; a 16 kHz stereo file is resampled
  to 24 kHz (its frame count says so);
- bad requests fail as ValueError naming the field: speaker ids, empty or special-token text,
  empty, garbage or missing audio, context audio over the cap, a prompt over the limit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from csm_fixtures import CONVERSATIONS, CSM_MARKS, SAMPLE_RATE, as_decoded, wav_bytes, context_codes, hf, model_dir, sine  # noqa: F401  (fixtures)

transformers = pytest.importorskip("transformers")

from baton_worker.models.csm.build import AUDIO_TOKEN_ID, NUM_CODEBOOKS  # noqa: E402
from baton_worker.models.csm.model import prompt_frames  # noqa: E402
from baton_worker.models.csm.prompt import ContextTurn, CsmPrompter  # noqa: E402
from baton_worker.models.csm.reference import generate_codes  # noqa: E402
from baton_worker.models.whisper.audio import AudioError, decode_audio  # noqa: E402

pytestmark = CSM_MARKS
K = NUM_CODEBOOKS
NEW_FRAMES = 6
# Two clips whose lengths are not whole frames: each must be encoded on its own, as transformers does.
TWO_CLIPS = [
    {"role": "0", "content": [{"type": "text", "text": "First clip."}, {"type": "audio", "path": sine(0.7, 200.0)}]},
    {"role": "1", "content": [{"type": "text", "text": "Second clip."}, {"type": "audio", "path": sine(0.45, 440.0)}]},
    {"role": "0", "content": [{"type": "text", "text": "And now me."}]},
]




def request(conversation: list[dict]) -> tuple[str, str, list[ContextTurn]]:
    """A fixture conversation as build()'s arguments, its audio as WAV bytes."""
    turns = [ContextTurn(m["content"][0]["text"], m["role"], wav_bytes(m["content"][1]["path"])) for m in conversation[:-1]]
    return conversation[-1]["content"][0]["text"], conversation[-1]["role"], turns




@pytest.fixture(scope="module")
def prompter(model_dir: Path) -> CsmPrompter:
    return CsmPrompter(model_dir)


@pytest.fixture(scope="module")
def config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def cases(prompter, model_dir: Path) -> dict:
    """name -> (the prompter's CsmPrompt, transformers' processor inputs on the decoded samples)."""
    processor = transformers.CsmProcessor.from_pretrained(model_dir)
    return {name: (prompter.build(*request(conversation)),
                   processor.apply_chat_template(as_decoded(conversation), tokenize=True, return_dict=True))
            for name, conversation in {**CONVERSATIONS, "two_clips": TWO_CLIPS}.items()}


def test_prompts_equal_transformers(cases, hf, config):
    for name, (prompt, inputs) in cases.items():
        ids = inputs["input_ids"][0]
        assert prompt.input_ids.dtype == np.int32 and prompt.input_ids.shape == ids.shape
        assert np.array_equal(prompt.input_ids, ids.numpy()), name
        expected = prompt_frames(ids, context_codes(hf, inputs), config)
        assert prompt.frames.dtype == torch.int64 and prompt.frames.shape == (ids.shape[0], K + 1)
        assert torch.equal(prompt.frames, expected), name
        if "input_values" in inputs:
            assert (prompt.frames[:, 0] >= 0).sum() > 1, f"{name}: context frames should be in the prompt"


def test_wav_round_trip_is_small():
    # The reference decodes the WAV rather than using the sine itself: the two differ by int16 rounding only.
    x = sine(0.5, 330.0)
    y = decode_audio(wav_bytes(x), sampling_rate=SAMPLE_RATE)
    assert y.shape == x.shape and np.abs(y - x).max() <= 0.5 / 32768 + 1e-7 and not np.array_equal(x, y)


def test_greedy_generation_equals_reference(cases, hf, model_dir: Path):
    for name, (prompt, inputs) in cases.items():
        ids = torch.from_numpy(prompt.input_ids).long()
        audio = ids == AUDIO_TOKEN_ID
        codes = prompt.frames[audio, :K] if audio.any() else None
        ours = generate_codes(model_dir, ids, NEW_FRAMES, audio_codes=codes)
        with torch.no_grad():
            theirs = hf.generate(**inputs, max_new_tokens=NEW_FRAMES, output_audio=False, do_sample=False,
                                 depth_decoder_do_sample=False)[0]
        assert ours.shape == (NEW_FRAMES, K) and torch.equal(ours, theirs), name


def test_codec_is_the_checkpoints(prompter, hf):
    theirs = hf.codec_model.state_dict()
    ours = prompter.codec.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    assert not any(p.requires_grad for p in prompter.codec.parameters())


def test_other_rates_and_channels_are_resampled(prompter):
    # 0.8 s at 16 kHz, stereo: 19200 samples at 24 kHz -> 10 frames of 1920.
    x = sine(0.8 * 16000 / SAMPLE_RATE, 220.0 * SAMPLE_RATE / 16000)
    prompt = prompter.build("Hi.", "0", [("Hello.", "1", wav_bytes(np.stack((x, 0.5 * x), axis=1), 16000))])
    assert int((prompt.input_ids == AUDIO_TOKEN_ID).sum()) == 10


def expect_error(prompter, match: str, text="Hi.", speaker="0", context=(), **kwargs):
    with pytest.raises(ValueError, match=match):
        prompter.build(text, speaker, list(context), **kwargs)


def test_bad_requests(prompter, monkeypatch):
    clip = wav_bytes(sine(0.5, 330.0))
    for speaker in ("alice", "-1", "01", "1.5", "", " 1", "\u0663", "1" * 12):
        expect_error(prompter, r"^voice: the speaker must be", speaker=speaker)
    expect_error(prompter, r"^role: the speaker", speaker="x", speaker_field="role")
    expect_error(prompter, r"^context\[0\]: the speaker", context=[("Yes.", "bob", clip)])
    for text in ("", "  \n"):
        expect_error(prompter, r"^input: the text is empty", text=text)
    expect_error(prompter, r"^text: the text is empty", text="", text_field="text")
    expect_error(prompter, r"^input: .*special token '<\|AUDIO\|>'", text="Say <|AUDIO|> now.")
    expect_error(prompter, r"^input: .*special token '<\|end_of_text\|>'", text="a<|end_of_text|><|begin_of_text|>[1]b")
    expect_error(prompter, r"^context\[1\]: the transcript is empty", context=[("Yes.", "1", clip), ("", "1", clip)])
    expect_error(prompter, r"^files\[0\]: not a readable audio file",
                 context=[ContextTurn("Yes.", "1", b"RIFF\x00\x00garbage, not audio" * 10, "files[0]")])
    expect_error(prompter, r"^context\[0\]: the file is empty", context=[("Yes.", "1", b"")])
    expect_error(prompter, r"^context\[0\]: a context turn needs its audio", context=[("Yes.", "1", None)])
    with pytest.raises(AudioError):  # the audio errors are Whisper's type (a ValueError)
        prompter.build("Hi.", "0", [("Yes.", "1", b"garbage")])

    monkeypatch.setattr(prompter, "max_context_seconds", 0.8)
    expect_error(prompter, r"^context\[1\]: the context audio totals 1\.0 s, over the 0\.8 s limit",
                 context=[("Yes.", "1", clip), ("No.", "0", clip)])
    expect_error(prompter, r"^context\[0\]: the audio is .* over the 0\.8 s limit",
                 context=[("Yes.", "1", wav_bytes(sine(1.5, 330.0)))])
    monkeypatch.undo()

    ok = prompter.build("Hello from Sesame.", "0")
    monkeypatch.setattr(prompter, "max_prompt_tokens", len(ok.input_ids) - 1)
    expect_error(prompter, rf"^input: the prompt is {len(ok.input_ids)} tokens, over the model's", text="Hello from Sesame.")
    expect_error(prompter, r"^input and the context: the prompt is", context=[("Yes.", "1", clip)])
