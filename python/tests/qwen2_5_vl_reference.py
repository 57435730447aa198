"""transformers' own answer for Qwen2.5-VL chat prompts: the directory's chat
template renders the messages, each <|image_pad|> becomes the image's run (its
grid from Qwen2VLImageProcessorPil, one token per merged patch, as
Qwen2_5_VLProcessor expands it), and Qwen2_5_VLForConditionalGeneration.generate
decodes greedily.

stdin: {"model_dir": ..., "max_new_tokens": N, "cases": [{"messages": chat messages in
        transformers' form (content parts {"type": "image"} / {"type": "text", "text": ...}),
        "images": [base64 bytes, ...]}]}
stdout: {"results": [{"prompt_ids": [...], "tokens": [...]}]}
"""

from __future__ import annotations

import base64
import io
import sys
from pathlib import Path

import reference_io

IMAGE_PAD = "<|image_pad|>"


def reference(model_dir: str, cases: list[dict], max_new_tokens: int) -> list[dict]:
    import torch
    import transformers
    from PIL import Image

    directory = Path(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    image_processor = transformers.Qwen2VLImageProcessorPil.from_pretrained(directory)
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    image_token_id = model.config.image_token_id
    results = []
    for case in cases:
        images = [Image.open(io.BytesIO(base64.b64decode(b))) for b in case["images"]]
        text = tokenizer.apply_chat_template(case["messages"], add_generation_prompt=True, tokenize=False)
        kwargs = {}
        if images:
            inputs = image_processor(images, return_tensors="pt")
            kwargs = {"pixel_values": inputs["pixel_values"], "image_grid_thw": inputs["image_grid_thw"]}
            merge = image_processor.merge_size**2
            pieces = text.split(IMAGE_PAD)
            text = pieces[0] + "".join(IMAGE_PAD * (int(g.prod()) // merge) + rest for g, rest in zip(inputs["image_grid_thw"], pieces[1:]))
        input_ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), mm_token_type_ids=(input_ids == image_token_id).int(),
                                 max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False, **kwargs)
        ids = input_ids[0].tolist()
        results.append({"prompt_ids": ids, "tokens": out[0, len(ids):].tolist()})
    return results


if __name__ == "__main__":
    sys.exit(reference_io.main(reference))
