"""Plain-PyTorch reference for the demo image model: what Baton must produce, byte for byte.

    ref = Reference("models/demo-image")
    png = ref.generate("a red fox", size="64x64", seed=7, index=0, steps=4)

CLI: python -m baton_worker.models.demo_image.reference MODEL_DIR --prompt ... --seed S
     [--size 64x64] [--steps 4] [--n 1] --out-dir DIR
     writes DIR/<i>.png and DIR/<i>.rgb (raw pixels, uint8 HxWx3) for i in 0..n-1
   or ... MODEL_DIR --requests FILE.json --out-dir DIR, FILE a list of
     {"prompt", "seed", "size", "steps", "n"}: writes DIR/<k>-<i>.png/.rgb for
     image i of request k (one process for many references).

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
    parser.add_argument("--prompt")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--requests", type=Path)
    parser.add_argument("--size")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    ref = Reference(args.model_dir)
    gen = ref.spec.generation
    if args.requests is not None:
        jobs = [(f"{k}-", r) for k, r in enumerate(json.loads(args.requests.read_text()))]
    elif args.prompt is not None and args.seed is not None:
        jobs = [("", {"prompt": args.prompt, "seed": args.seed, "size": args.size, "steps": args.steps, "n": args.n})]
    else:
        parser.error("give --prompt and --seed, or --requests")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    images = 0
    for prefix, job in jobs:
        size = job.get("size") or gen.default_size
        steps = job.get("steps") or gen.default_inference_steps
        for i in range(job.get("n") or 1):
            pixels = ref.pixels(job["prompt"], size, int(job["seed"]), i, steps)
            (args.out_dir / f"{prefix}{i}.rgb").write_bytes(pixels.numpy().tobytes())
            (args.out_dir / f"{prefix}{i}.png").write_bytes(encode_png(pixels))
            images += 1
    print(json.dumps({"images": images, "seconds": round(time.perf_counter() - started, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
