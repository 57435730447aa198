"""Whisper's front end and encoder against transformers, on random directories:
LogMel equals WhisperFeatureExtractor for short, exact, over-long and silent
clips at 80 and 128 mel bins (and agrees with a float64 numpy rfft, an
independent reference for the STFT); the comparison is sharp enough to catch a symmetric Hann window or
unnormalised mel filters; the encoder equals transformers' encoder for a batch
of clips, and each clip alone gives its row of the batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from speech_clips import SR, clip

from baton_worker.models.whisper.build import make_whisper_dir

transformers = pytest.importorskip("transformers")
from transformers.audio_utils import mel_filter_bank  # noqa: E402

from baton_worker.model.weights import WeightReader  # noqa: E402
from baton_worker.models.whisper.encoder import ENCODER_PREFIX, WhisperEncoder  # noqa: E402
from baton_worker.models.whisper.features import LogMel, mel_filters  # noqa: E402



@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_whisper_dir(tmp_path_factory.mktemp("whisper80"), seed=0, num_mel_bins=80)


@pytest.fixture(scope="module")
def model_dir_128(tmp_path_factory) -> Path:
    return make_whisper_dir(tmp_path_factory.mktemp("whisper128"), seed=1, num_mel_bins=128)



CLIPS = {
    "0.5s": lambda: clip(0.5, 1),
    "3s": lambda: clip(3.0, 2),
    "30s": lambda: clip(30.0, 3),
    "35s": lambda: clip(35.0, 4),  # truncated to 30 s
    "silence": lambda: np.zeros(2 * SR, dtype=np.float32),
    "odd length": lambda: clip(1.2345, 5),  # not a multiple of the hop
}


def reference(model_dir: Path, audio: list[np.ndarray]) -> torch.Tensor:
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(model_dir)
    return extractor(audio, sampling_rate=SR, return_tensors="pt").input_features


@pytest.mark.parametrize("mels", [80, 128])
def test_features_equal_transformers(mels: int, model_dir: Path, model_dir_128: Path):
    d = model_dir if mels == 80 else model_dir_128
    log_mel = LogMel.from_dir(d)
    audio = [make() for make in CLIPS.values()]
    ours = log_mel(audio)
    assert ours.shape == (len(audio), mels, 3000) and ours.dtype == torch.float32
    theirs = reference(d, audio)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    # Each clip alone: the max - 8 floor is per clip, not per batch.
    for i, x in enumerate(audio):
        torch.testing.assert_close(log_mel([x])[0], ours[i], atol=1e-6, rtol=0)
    # Silence is the constant floor (log10(1e-10) + 4) / 4.
    torch.testing.assert_close(ours[list(CLIPS).index("silence")], torch.full((mels, 3000), -1.5))


def test_num_frames_matches_attention_mask(model_dir: Path):
    log_mel = LogMel.from_dir(model_dir)
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(model_dir)
    lengths = [1, 159, 160, 161, 8000, 479_999, 480_000, 560_000]
    audio = [np.ones(n, dtype=np.float32) for n in lengths]
    mask = extractor(audio, sampling_rate=SR, return_attention_mask=True, return_tensors="np").attention_mask
    assert [log_mel.num_frames(n) for n in lengths] == mask.sum(axis=1).tolist()


def test_mel_filters_equal_transformers():
    for mels in (80, 128):
        np.testing.assert_array_equal(mel_filters(mels, 400, SR), transformers.WhisperFeatureExtractor(feature_size=mels).mel_filters)


def test_features_agree_with_numpy_rfft(model_dir: Path):
    """An independent float64 STFT: frames centred by reflect padding n_fft / 2, a periodic Hann window, rfft."""
    x = clip(3.0, 7)
    padded = np.pad(np.pad(x, (0, 30 * SR - x.shape[0])).astype(np.float64), 200, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, 400)[::160][:3000]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    log = np.log10(np.maximum(power @ mel_filters(80, 400, SR), 1e-10)).T
    expected = (np.maximum(log, log.max() - 8.0) + 4.0) / 4.0
    np.testing.assert_allclose(LogMel.from_dir(model_dir)([x])[0].numpy(), expected, atol=1e-5, rtol=0)


def test_window_and_mel_norm_matter(model_dir: Path):
    """The 1e-5 comparison above would catch a symmetric Hann window or filters without slaney area scaling."""
    audio = [clip(3.0, 2), clip(0.5, 1)]
    theirs = reference(model_dir, audio)
    log_mel = LogMel.from_dir(model_dir)
    torch.testing.assert_close(log_mel(audio), theirs, atol=1e-5, rtol=0)

    symmetric = LogMel.from_dir(model_dir)
    symmetric.window = torch.hann_window(400, periodic=False)
    assert (symmetric(audio) - theirs).abs().max() > 1e-3

    for norm, scale in ((None, "slaney"), ("slaney", "htk")):
        wrong = LogMel.from_dir(model_dir)
        bank = mel_filter_bank(201, 80, 0.0, 8000.0, SR, norm=norm, mel_scale=scale)
        wrong.filters = torch.from_numpy(bank).float().T.contiguous()
        assert (wrong(audio) - theirs).abs().max() > 1e-2, (norm, scale)


@pytest.fixture(scope="module")
def hf(model_dir: Path):
    return transformers.WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_checkpoint_names(model_dir: Path):
    reader = WeightReader(model_dir, torch.float32, torch.device("cpu"))
    assert reader.has(ENCODER_PREFIX + "conv1.weight") and reader.has(ENCODER_PREFIX + "embed_positions.weight")
    assert not reader.has(ENCODER_PREFIX + "layers.0.self_attn.k_proj.bias")


def test_encoder_equals_transformers(model_dir: Path, hf):
    config = transformers.AutoConfig.from_pretrained(model_dir).to_dict()
    reader = WeightReader(model_dir, torch.float32, torch.device("cpu"))
    encoder = WhisperEncoder(reader.get, config)
    features = LogMel.from_dir(model_dir)([clip(0.5, 1), clip(3.0, 2), clip(35.0, 4)])
    ours = encoder(features)
    assert ours.shape == (3, 1500, 64)
    with torch.no_grad():
        theirs = hf.model.encoder(features).last_hidden_state
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    # Clips differ, and each alone gives its row of the batch.
    assert (ours[0] - ours[1]).abs().max() > 0.1
    for i in range(3):
        torch.testing.assert_close(encoder(features[i : i + 1])[0], ours[i], atol=1e-5, rtol=0)
    with pytest.raises(ValueError):
        encoder(features[:, :, :2999])
