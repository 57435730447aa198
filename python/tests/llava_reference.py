"""transformers' own answer for LLaVA prompts: LlavaProcessor (CLIP's PIL image
processor + the directory's tokenizer) builds input_ids and pixel_values, and
LlavaForConditionalGeneration.generate decodes greedily.

stdin: {"model_dir": ..., "max_new_tokens": N, "cases": [{"messages": chat messages in
        transformers' form (content parts {"type": "image"} / {"type": "text", "text": ...}),
        rendered by the processor's apply_chat_template, "images": [base64 bytes, ...]}]}
stdout: {"results": [{"prompt_ids": [...], "tokens": [...]}]}
"""

from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path

import reference_io


def reference(model_dir: str, cases: list[dict], max_new_tokens: int) -> list[dict]:
    import torch
    import transformers
    from PIL import Image

    directory = Path(model_dir)
    processor_config = json.loads((directory / "processor_config.json").read_text())
    image_processor = transformers.CLIPImageProcessorPil.from_pretrained(directory)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    processor = transformers.LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=processor_config["patch_size"],
        vision_feature_select_strategy=processor_config["vision_feature_select_strategy"],
        image_token=processor_config["image_token"],
        num_additional_image_tokens=processor_config["num_additional_image_tokens"],
        chat_template=tokenizer.chat_template,
    )
    model = transformers.LlavaForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    results = []
    for case in cases:
        images = [Image.open(io.BytesIO(base64.b64decode(b))) for b in case["images"]]
        text = processor.apply_chat_template(case["messages"], add_generation_prompt=True, tokenize=False)
        inputs = processor(text=text, images=images or None, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        ids = inputs["input_ids"][0].tolist()
        results.append({"prompt_ids": ids, "tokens": out[0, len(ids):].tolist()})
    return results


if __name__ == "__main__":
    sys.exit(reference_io.main(reference))
