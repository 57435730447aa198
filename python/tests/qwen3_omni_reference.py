"""transformers' side of test/e2e/qwen3-omni.test.ts: test media, and Qwen3-Omni chats with audio and
images through Qwen3OmniMoeProcessor's chat template and the thinker's greedy generate.

  python qwen3_omni_reference.py media DIR
      writes the test's clips (16-bit mono WAV at 16 kHz: a.wav 1.3 s, b.wav 2.4 s, c.wav 0.6 s) and
      images (p.png 64x96, q.png 96x64) into DIR
  python qwen3_omni_reference.py chat MODEL_DIR MEDIA_DIR MAX_NEW_TOKENS < cases.json
      cases: a list, each [part, ...] (one user turn; a part is {"text": ...}, {"audio": "a.wav"} or
      {"image": "p.png"}) or {"messages": [...]} (a text conversation as OpenAI's chat takes it); prints
      [{"prompt_ids": [...], "tokens": [...]}, ...] (the processor's expanded prompt and the thinker's
      greedy tokens)
"""

from __future__ import annotations

import json
import sys
import wave
from pathlib import Path

import numpy as np

RATE = 16000
CLIPS = {"a.wav": (1.3, 0), "b.wav": (2.4, 1), "c.wav": (0.6, 2)}
IMAGES = {"p.png": (64, 96, 3), "q.png": (96, 64, 4)}


def write_media(out: Path) -> None:
    from PIL import Image

    out.mkdir(parents=True, exist_ok=True)
    for name, (seconds, seed) in CLIPS.items():
        rng = np.random.default_rng(seed)
        t = np.arange(int(seconds * RATE)) / RATE
        x = 0.3 * np.sin(2 * np.pi * (220 + 110 * seed) * t) + 0.05 * rng.standard_normal(t.shape)
        with wave.open(str(out / name), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes(np.round(x * 32767).astype("<i2").tobytes())
    for name, (width, height, seed) in IMAGES.items():
        pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(out / name, format="PNG")


def read_wav(path: Path) -> np.ndarray:
    """The clip as float32 samples, as PyAV decodes 16-bit PCM (x / 32768)."""
    with wave.open(str(path), "rb") as w:
        return (np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768).astype(np.float32)


def chat(model_dir: Path, media: Path, cases: list, max_new_tokens: int) -> list[dict]:
    import torch
    import transformers
    from PIL import Image

    from baton_worker.models.qwen3_omni.build import load_processor

    transformers.logging.set_verbosity_error()
    processor = load_processor(model_dir)
    thinker = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).thinker.eval()
    results = []
    for parts in cases:
        if isinstance(parts, dict):
            results.append(_greedy(processor, thinker, parts["messages"], max_new_tokens))
            continue
        content = []
        for part in parts:
            if "audio" in part:
                content.append({"type": "audio", "audio": read_wav(media / part["audio"])})
            elif "image" in part:
                content.append({"type": "image", "image": Image.open(media / part["image"]).convert("RGB")})
            else:
                content.append({"type": "text", "text": part["text"]})
        results.append(_greedy(processor, thinker, [{"role": "user", "content": content}], max_new_tokens))
    return results


def _greedy(processor, thinker, messages: list, max_new_tokens: int) -> dict:
    import torch

    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    with torch.no_grad():
        out = thinker.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return {"prompt_ids": ids, "tokens": out[0, len(ids):].tolist()}


def main(argv: list[str]) -> int:
    if argv[0] == "media":
        write_media(Path(argv[1]))
        return 0
    if argv[0] == "chat":
        print(json.dumps(chat(Path(argv[1]), Path(argv[2]), json.load(sys.stdin), int(argv[3]))))
        return 0
    raise SystemExit(f"unknown command {argv[0]!r} (media, chat)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
