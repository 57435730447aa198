"""transformers' side of bench/vision_bench.mjs: the same image chat requests
through Qwen2_5_VLForConditionalGeneration.generate on the same directory,
greedy, every output max_new_tokens long: at concurrency 1 one request at a
time, at concurrency C in batches of C (left-padded prompts, one generate
call per batch: the best transformers does without a server).

stdin:  {"model_dir": ..., "max_new_tokens": N, "concurrency": [1, 8],
         "requests": [{"text": ..., "image": base64 PNG}]}
stdout: {"1": {"seconds": s, "requests": n}, "8": {...}}
"""

from __future__ import annotations

import base64
import io
import json
import sys
import time

IMAGE_PAD = "<|image_pad|>"


def main() -> int:
    import torch
    import transformers
    from PIL import Image

    request = json.load(sys.stdin)
    directory, new = request["model_dir"], request["max_new_tokens"]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    processor = transformers.Qwen2VLImageProcessorPil.from_pretrained(directory)
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    image_token = model.config.image_token_id
    prepared = []
    for r in request["requests"]:
        image = Image.open(io.BytesIO(base64.b64decode(r["image"])))
        pixels = processor([image], return_tensors="pt")
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": r["text"]}]}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        count = int(pixels["image_grid_thw"][0].prod()) // processor.merge_size**2
        ids = tokenizer(text.replace(IMAGE_PAD, IMAGE_PAD * count), add_special_tokens=False)["input_ids"]
        prepared.append((ids, pixels["pixel_values"], pixels["image_grid_thw"]))

    def run(batch) -> None:
        width = max(len(ids) for ids, _, _ in batch)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, _, _ in batch])
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _, _ in batch])
        with torch.no_grad():
            model.generate(input_ids=input_ids, attention_mask=mask, mm_token_type_ids=(input_ids == image_token).int(),
                           pixel_values=torch.cat([p for _, p, _ in batch]), image_grid_thw=torch.cat([g for _, _, g in batch]),
                           max_new_tokens=new, min_new_tokens=new, do_sample=False)

    run(prepared[:1])  # warm-up
    results = {}
    for c in request["concurrency"]:
        t0 = time.perf_counter()
        for i in range(0, len(prepared), c):
            run(prepared[i : i + c])
        results[str(c)] = {"seconds": time.perf_counter() - t0, "requests": len(prepared)}
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
