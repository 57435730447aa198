"""transformers' CSM speech for the e2e tests: greedy codes from
CsmForConditionalGeneration.generate (both levels greedy) and their audio as
transformers decodes it (output_audio: Mimi's decode of the codes up to the stop
frame), as s16le bytes the way the server writes PCM (round(clamp(x) * 32767)).

stdin: {"model_dir": ..., "max_new_frames": N, "cases": [{"text", "speaker",
"context": [{"text", "speaker", "wav": path of a mono int16 WAV}]}]}
stdout: {"results": [{"frames": [[K codes] ...] (the stop frame included when
generation stopped on it), "pcm": base64 s16le}]}
"""

from __future__ import annotations

import base64
import json
import sys
import wave

import numpy as np
import torch
import transformers


def read_wav(path: str) -> np.ndarray:
    """An int16 WAV's samples as float32, as the worker's decoder gives them (s16 / 32768)."""
    with wave.open(path, "rb") as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1, path
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return (pcm.astype(np.float32) / 32768.0).astype(np.float32)


def main() -> None:
    request = json.load(sys.stdin)
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model_dir = request["model_dir"]
    processor = transformers.CsmProcessor.from_pretrained(model_dir)
    model = transformers.CsmForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    results = []
    for case in request["cases"]:
        conversation = [
            {"role": c["speaker"], "content": [{"type": "text", "text": c["text"]}, {"type": "audio", "path": read_wav(c["wav"])}]}
            for c in case.get("context", [])
        ]
        conversation.append({"role": case["speaker"], "content": [{"type": "text", "text": case["text"]}]})
        inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
        with torch.no_grad():
            out = model.generate(**inputs, do_sample=False, depth_decoder_do_sample=False,
                                 max_new_tokens=request["max_new_frames"], output_audio=True, return_dict_in_generate=True)
        frames = out.sequences[0]
        audio = out.audio[0]
        pcm = torch.round(audio.reshape(-1).clamp(-1.0, 1.0) * 32767.0).to(torch.int16).numpy().astype("<i2")
        results.append({"frames": frames.tolist(), "pcm": base64.b64encode(pcm.tobytes()).decode()})
    json.dump({"results": results}, sys.stdout)


if __name__ == "__main__":
    main()
