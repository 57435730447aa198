"""Plain-PyTorch reference for the demo image model: what Baton must produce, byte for byte.

    ref = Reference("models/demo-image")
    png = ref.generate("a red fox", size="64x64", seed=7, index=0, steps=4)

CLI: python -m baton_worker.models.demo_image.reference MODEL_DIR --prompt ... --seed S
     [--size 64x64] [--steps 4] [--n 1] --out-dir DIR
     writes DIR/<i>.png and DIR/<i>.rgb (raw pixels, uint8 HxWx3) for i in 0..n-1

One image at a time, no graph: prompt ids -> text encoder -> a Python `for`
loop of `steps` DDIM steps from the seeded noise -> decoder -> pixels -> PNG.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from .pipeline import DemoImagePipeline
from .png import encode_png, to_pixels
from .spec import initial_latents, prompt_ids


class Reference:
    def __init__(self, model_dir: str | Path):
        self.pipeline = DemoImagePipeline.load(model_dir)
        self.spec = self.pipeline.spec

    def pixels(self, prompt: str, size: str, seed: int, index: int, steps: int) -> torch.Tensor:
        """uint8 [H, W, 3]."""
        p = self.pipeline
        self.spec.check_steps(steps)
        (text,) = p.encode_text([prompt_ids(prompt, self.spec.text)])
        x = initial_latents(self.spec, size, seed, index)
        for k in range(steps):
            (x,) = p.denoise_step([x], [text], [k], [steps])
        (image,) = p.decode([x])
        return to_pixels(image)

    def generate(self, prompt: str, size: str, seed: int, index: int, steps: int) -> bytes:
        return encode_png(self.pixels(prompt, size, seed, index, steps))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baton_worker.models.demo_image.reference")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--size")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    ref = Reference(args.model_dir)
    size = args.size or ref.spec.generation.default_size
    steps = args.steps or ref.spec.generation.default_inference_steps
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for i in range(args.n):
        pixels = ref.pixels(args.prompt, size, args.seed, i, steps)
        (args.out_dir / f"{i}.rgb").write_bytes(pixels.numpy().tobytes())
        (args.out_dir / f"{i}.png").write_bytes(encode_png(pixels))
    print(json.dumps({"images": args.n, "size": size, "steps": steps, "seconds": round(time.perf_counter() - started, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
