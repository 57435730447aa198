"""Whisper's log-mel front end in PyTorch: raw 16 kHz clips -> input_features
[batch, feature_size, 3000], equal to transformers' WhisperFeatureExtractor
(its torch path) within float32 rounding.

Each clip is padded with padding_value (or cut) to chunk_length seconds, and
the whole batch goes through one STFT: n_fft 400 with a periodic Hann window,
hop 160, centred frames with reflect padding (torch.stft's defaults, which is
what transformers and openai/whisper both run). The last of the 3001 frames
is dropped. Power spectrum -> slaney mel filter bank (0-8 kHz, slaney-scaled
areas) -> log10 of max(x, 1e-10) -> floor at the clip's max - 8 -> (x + 4) / 4.
The floor is per clip, so a clip's features never depend on its batch.

The filter bank is computed in float64 exactly as transformers'
audio_utils.mel_filter_bank(norm="slaney", mel_scale="slaney") does and only
then rounded to float32, so the two agree bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

# transformers hard-codes the filter bank's top at 8 kHz whatever the sampling rate.
MEL_MAX_HZ = 8000.0


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    mel = 3.0 * hz / 200.0
    log = hz >= 1000.0
    mel[log] = 15.0 + np.log(hz[log] / 1000.0) * (27.0 / np.log(6.4))
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = 200.0 * mel / 3.0
    log = mel >= 15.0
    hz[log] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel[log] - 15.0))
    return hz


def mel_filters(num_mels: int, n_fft: int, sampling_rate: int) -> np.ndarray:
    """[n_fft // 2 + 1, num_mels] float64: triangles on the slaney scale, each scaled to unit area
    (2 / bandwidth), the same numbers and float64 operation order as transformers' mel_filter_bank."""
    bins = 1 + n_fft // 2
    mel = np.linspace(_hz_to_mel(np.array([0.0]))[0], _hz_to_mel(np.array([MEL_MAX_HZ]))[0], num_mels + 2)
    edges = _mel_to_hz(mel)
    fft_hz = np.linspace(0, sampling_rate // 2, bins)
    diff = np.diff(edges)
    slopes = edges[None, :] - fft_hz[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    filters = np.maximum(np.zeros(1), np.minimum(down, up))
    return filters * (2.0 / (edges[2 : num_mels + 2] - edges[:num_mels]))[None, :]


class LogMel:
    """Batched log-mel features for Whisper, on `device` (the STFT and the filter bank run there)."""

    def __init__(
        self,
        feature_size: int = 80,
        sampling_rate: int = 16000,
        n_fft: int = 400,
        hop_length: int = 160,
        chunk_length: int = 30,
        padding_value: float = 0.0,
        device: torch.device | str = "cpu",
    ):
        self.feature_size = feature_size
        self.sampling_rate = sampling_rate
        self.n_fft = n_fft
        self.hop_length = hop_length
        self.padding_value = padding_value
        self.n_samples = chunk_length * sampling_rate
        self.nb_max_frames = self.n_samples // hop_length
        self.device = torch.device(device)
        self.window = torch.hann_window(n_fft, periodic=True, device=self.device)
        # [mels, freqs], so one matmul maps [batch, freqs, frames] to [batch, mels, frames].
        self.filters = torch.from_numpy(mel_filters(feature_size, n_fft, sampling_rate)).to(self.device, torch.float32).T.contiguous()

    @classmethod
    def from_dir(cls, model_dir: Path | str, device: torch.device | str = "cpu") -> LogMel:
        """From the model directory's preprocessor_config.json (transformers' WhisperFeatureExtractor fields)."""
        cfg = json.loads((Path(model_dir) / "preprocessor_config.json").read_text())
        if float(cfg.get("dither", 0.0)) != 0.0:
            raise ValueError("preprocessor_config.json asks for dither; Baton's Whisper features are deterministic")
        if cfg.get("do_normalize"):
            raise ValueError("preprocessor_config.json asks for do_normalize, which Whisper checkpoints do not use")
        mel = cls(
            feature_size=int(cfg.get("feature_size", 80)),
            sampling_rate=int(cfg.get("sampling_rate", 16000)),
            n_fft=int(cfg.get("n_fft", 400)),
            hop_length=int(cfg.get("hop_length", 160)),
            chunk_length=int(cfg.get("chunk_length", 30)),
            padding_value=float(cfg.get("padding_value", 0.0)),
            device=device,
        )
        # The saved derived sizes must agree with the ones recomputed here (transformers recomputes them too).
        for key in ("n_samples", "nb_max_frames"):
            if key in cfg and int(cfg[key]) != getattr(mel, key):
                raise ValueError(f"preprocessor_config.json: {key} {cfg[key]} does not match chunk_length/hop_length ({getattr(mel, key)})")
        return mel

    def num_frames(self, num_samples: int) -> int:
        """Frames (of nb_max_frames) whose centre sample is real audio rather than padding:
        the count of ones in transformers' rescaled attention_mask for a clip of num_samples."""
        return min(-(-num_samples // self.hop_length), self.nb_max_frames)

    def pad(self, audio: Sequence[np.ndarray]) -> torch.Tensor:
        """[batch, n_samples] float32 on the CPU: each mono clip cut or padded (right, padding_value) to chunk_length."""
        batch = torch.full((len(audio), self.n_samples), self.padding_value, dtype=torch.float32)
        for row, clip in zip(batch, audio):
            clip = np.asarray(clip, dtype=np.float32)
            if clip.ndim != 1:
                raise ValueError(f"Whisper features take mono clips (1-D arrays); got shape {clip.shape}")
            n = min(clip.shape[0], self.n_samples)
            row[:n] = torch.from_numpy(clip[:n])
        return batch

    @torch.inference_mode()
    def whole(self, clip: np.ndarray) -> torch.Tensor:
        """[feature_size, len(clip) // hop_length] for one clip of any length, unpadded: what transformers'
        extractor gives long-form audio (truncation=False, padding="longest"), windows then sliced from it."""
        wave = torch.from_numpy(np.ascontiguousarray(clip, dtype=np.float32))[None].to(self.device)
        return self._log_mel(wave)[0]

    @torch.inference_mode()
    def __call__(self, audio: Sequence[np.ndarray]) -> torch.Tensor:
        """Mono float32 clips at sampling_rate -> [batch, feature_size, nb_max_frames] float32 on device."""
        if not audio:
            return torch.zeros(0, self.feature_size, self.nb_max_frames, device=self.device)
        return self._log_mel(self.pad(audio).to(self.device))

    def _log_mel(self, waves: torch.Tensor) -> torch.Tensor:
        stft = torch.stft(waves, self.n_fft, self.hop_length, window=self.window, return_complex=True)
        power = (stft[..., :-1].abs() ** 2).contiguous()
        log = (self.filters @ power).clamp(min=1e-10).log10()
        log = torch.maximum(log, log.amax(dim=(1, 2), keepdim=True) - 8.0)
        return (log + 4.0) / 4.0
