"""transformers' own answer for Whisper transcriptions: each case's audio (16 kHz
float32 samples, base64) through WhisperFeatureExtractor and
WhisperForConditionalGeneration.generate, greedy. Up to 30 s: short-form, the
features padded to 30 s; longer: long-form (truncation=False,
padding="longest", timestamps on), as transformers' pipeline runs it. Without a
language, transformers detects it.

stdin: {"model_dir": ..., "max_new_tokens": N (unused: Whisper's own limit applies),
        "cases": [{"audio": base64 float32, "language": "en" | null, "task": "transcribe" | "translate",
                   "timestamps": bool, "prompt": text | null}]}
stdout: {"results": [{"tokens": [generate's ids], "text": their decode without special tokens, "language": code}]}
"""

from __future__ import annotations

import base64
import sys

import reference_io


def reference(model_dir: str, cases: list[dict], max_new_tokens: int) -> list[dict]:
    import numpy as np
    import torch
    import transformers

    model = transformers.WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(model_dir)
    tokenizer = transformers.WhisperTokenizer.from_pretrained(model_dir)
    id_to_language = {v: k[2:-2] for k, v in model.generation_config.lang_to_id.items()}
    results = []
    for case in cases:
        audio = np.frombuffer(base64.b64decode(case["audio"]), np.float32)
        long_form = len(audio) > extractor.n_samples
        if long_form:
            inputs = extractor(audio, sampling_rate=16000, return_tensors="pt", truncation=False, padding="longest", return_attention_mask=True)
        else:
            inputs = extractor(audio, sampling_rate=16000, return_tensors="pt")
        features = inputs["input_features"]
        language = case.get("language")
        with torch.no_grad():
            if language is None:
                language = id_to_language[int(model.detect_language(features[:, :, :3000])[0])]
            # Short-form: one generate call (transformers would otherwise go on past a window that fills the
            # decoder's 448 positions without an end token, which random weights do and real speech does not).
            kwargs = {"attention_mask": inputs["attention_mask"]} if long_form else {"force_unique_generate_call": True}
            if case.get("prompt"):
                kwargs["prompt_ids"] = torch.tensor(tokenizer.get_prompt_ids(case["prompt"]))
            out = model.generate(features, language=language, task=case["task"], return_timestamps=case["timestamps"] or long_form,
                                 do_sample=False, **kwargs)
        ids = out[0].tolist()
        results.append({"tokens": ids, "text": tokenizer.decode(ids, skip_special_tokens=True), "language": language})
    return results


if __name__ == "__main__":
    sys.exit(reference_io.main(reference))
