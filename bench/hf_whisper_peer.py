"""transformers' side of bench/whisper_bench.mjs: the same clips through
WhisperFeatureExtractor and WhisperForConditionalGeneration.generate on the
same directory, greedy, language and task given: at concurrency 1 one clip
at a time, at concurrency C in batches of C (one generate call per batch,
the best transformers does without a server). force_unique_generate_call: a
random-weight decoder never ends a window, and transformers would otherwise
go on decoding past the 448 positions, work Baton does not do.

stdin:  {"model_dir": ..., "concurrency": [1, 8, 32], "counts": {"1": n, ...}, "clips": [base64 float32 16 kHz]}
stdout: {"1": {"seconds": s, "requests": n, "tokens": t}, ...}
"""

from __future__ import annotations

import base64
import json
import sys
import time


def main() -> int:
    import numpy as np
    import torch
    import transformers

    request = json.load(sys.stdin)
    directory = request["model_dir"]
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(directory)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    clips = [np.frombuffer(base64.b64decode(c), np.float32) for c in request["clips"]]

    def run(batch: list) -> int:
        features = extractor(batch, sampling_rate=16000, return_tensors="pt")["input_features"]
        with torch.no_grad():
            out = model.generate(features, language="en", task="transcribe", do_sample=False, force_unique_generate_call=True)
        return int((out != model.generation_config.eos_token_id).sum())

    run(clips[:1])  # warm-up
    results = {}
    for c in request["concurrency"]:
        n = request["counts"][str(c)]
        t0 = time.perf_counter()
        tokens = sum(run(clips[i : min(i + c, n)]) for i in range(0, n, c))
        results[str(c)] = {"seconds": time.perf_counter() - t0, "requests": n, "tokens": tokens}
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
