"""Builds the demo image-generation model directory (random weights).

CLI: python -m baton_worker.models.demo_image.build --out models/demo-image

    OUT/config.json          BatonDemoImage: network shapes, schedule, and the
                             `image_generation` block the API validates against (spec.py)
    OUT/model.safetensors    the three networks' weights (networks.py), float32,
                             named text.*, denoiser.*, decoder.*

Deterministic (a fixed seed, torch only): two builds are byte-identical, and
files already up to date are not rewritten. About 0.15M parameters: a 64x64
image takes a few milliseconds per denoise step on one CPU core.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import save

from ...model.random_weights import build_cli, write_if_changed
from .networks import random_weights
from .spec import DemoImageSpec

WEIGHTS_SEED = 20251124


def build(out: Path, spec: DemoImageSpec | None = None) -> Path:
    spec = spec or DemoImageSpec()
    out.mkdir(parents=True, exist_ok=True)
    config = (json.dumps(spec.to_config(), indent=2, sort_keys=True) + "\n").encode()
    write_if_changed(out / "config.json", config)
    write_if_changed(out / spec.weights, save(random_weights(spec, WEIGHTS_SEED), metadata={"format": "pt"}))
    return out


def main(argv: list[str] | None = None) -> int:
    return build_cli("python -m baton_worker.models.demo_image.build", "build the demo image model", build, argv)


if __name__ == "__main__":
    sys.exit(main())
