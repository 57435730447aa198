"""transformers' side of bench/csm_bench.mjs: the same speech requests through
CsmProcessor.apply_chat_template and CsmForConditionalGeneration.generate
(output_audio=True: the codes and their Mimi decode) on the same directory,
greedy in the backbone and the depth decoder: at concurrency C in batches of C
conversations (left-padded, one generate call per batch: the best transformers
does without a server). transformers hands audio back only once the whole
batch is decoded, so each request's time to first audio is its batch's
latency. torch gets the threads Baton's worker takes (set_cpu_threads, its own
rule), so neither side has more cores to use.

stdin:  {"model_dir": ..., "concurrency": [1, 8], "repeats": R, "requests": [{"text": ..., "voice": "0"}]}
stdout: {"1": [{"seconds": wall, "ttfa": [s per request], "samples": [per request]} per repeat], ...}
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    import torch
    import transformers
    from baton_worker.runtime.server import set_cpu_threads

    request = json.load(sys.stdin)
    directory = request["model_dir"]
    set_cpu_threads()
    processor = transformers.CsmProcessor.from_pretrained(directory)
    # The device Baton's worker takes by default (CUDA when there is one), so both sides run on the same one.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = transformers.CsmForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval().to(device)
    conversations = [[{"role": r["voice"], "content": [{"type": "text", "text": r["text"]}]}] for r in request["requests"]]

    def run(batch: list) -> list[int]:
        inputs = processor.apply_chat_template(batch, tokenize=True, return_dict=True, return_tensors="pt").to(device)
        with torch.no_grad():
            audio = model.generate(**inputs, do_sample=False, depth_decoder_do_sample=False, output_audio=True)
        return [int(a.shape[-1]) for a in audio]

    run(conversations[:1])  # warm-up: one alone, then a full batch
    run(conversations[: max(request["concurrency"])])
    results = {}
    for c in request["concurrency"]:
        results[str(c)] = []
        for _ in range(request["repeats"]):
            ttfa, samples = [], []
            t0 = time.perf_counter()
            for i in range(0, len(conversations), c):
                batch, start = conversations[i : i + c], time.perf_counter()
                samples += run(batch)
                ttfa += [time.perf_counter() - start] * len(batch)
            results[str(c)].append({"seconds": time.perf_counter() - t0, "ttfa": ttfa, "samples": samples})
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
