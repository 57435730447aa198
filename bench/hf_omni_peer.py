"""transformers' side of bench/omni_bench.mjs: the same audio chat requests through
Qwen3OmniMoeProcessor's chat template and the thinker's generate on the same directory, greedy, every
output max_new_tokens long: at concurrency 1 one request at a time, at concurrency C in batches of C (the
processor pads the prompts and the clips; one generate call per batch: the best transformers does without
a server), on the device Baton's worker takes. torch gets the threads Baton's worker takes
(set_cpu_threads), so neither side has more cores.

stdin:  {"model_dir": ..., "max_new_tokens": N, "concurrency": [1, 8],
         "requests": [{"text": ..., "audio": base64 16-bit mono WAV at 16 kHz}]}
stdout: {"1": {"seconds": s, "requests": n}, "8": {...}}
"""

from __future__ import annotations

import base64
import io
import json
import sys
import time
import wave


def _samples(data: str):
    import numpy as np

    with wave.open(io.BytesIO(base64.b64decode(data)), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768


def main() -> int:
    import torch
    import transformers

    from baton_worker.models.qwen3_omni.build import load_processor
    from baton_worker.runtime.server import set_cpu_threads

    request = json.load(sys.stdin)
    directory, new = request["model_dir"], request["max_new_tokens"]
    set_cpu_threads()
    transformers.logging.set_verbosity_error()
    processor = load_processor(directory)
    processor.tokenizer.padding_side = "left"
    # The device Baton's worker takes by default (CUDA when there is one), so both sides run on the same one.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    thinker = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).thinker.eval().to(device)
    conversations = [[{"role": "user", "content": [{"type": "audio", "audio": _samples(r["audio"])}, {"type": "text", "text": r["text"]}]}]
                     for r in request["requests"]]

    def run(batch: list) -> None:
        inputs = processor.apply_chat_template(batch, add_generation_prompt=True, tokenize=True, return_dict=True,
                                               return_tensors="pt", padding=True).to(device)
        with torch.no_grad():
            thinker.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False)

    run(conversations[:1])  # warm-up
    results = {}
    for c in request["concurrency"]:
        t0 = time.perf_counter()
        for i in range(0, len(conversations), c):
            run(conversations[i : i + c])
        results[str(c)] = {"seconds": time.perf_counter() - t0, "requests": len(conversations)}
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
