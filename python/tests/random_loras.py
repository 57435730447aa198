"""Random-weight PEFT LoRA adapters for a random_models.py base, and their
transformers + PEFT reference outputs (for the LoRA parity tests).

Library:  make_lora_dirs(base_dir, out_dir, specs=SPECS) -> dict[name, Path]      (a1..a4)
          make_lora_dir(base_dir, out_dir, spec, seed) -> Path
          peft_greedy(base_dir, lora_dir, prompts, max_new_tokens) -> list[list[int]]
CLI:      python python/tests/random_loras.py --base DIR --out DIR
              builds SPECS and REFUSED_SPECS (rank32: an adapter a --max-lora-rank 16 worker refuses);
              prints {"adapters": {"a1": DIR/a1, ...}, "refused": {"rank32": DIR/rank32}}
          python python/tests/random_loras.py --base DIR --out DIR --bench N
              builds lora0..loraN-1 (rank 16 on all seven projections) for bench/lora_bench.mjs
          python python/tests/random_loras.py --base DIR --reference [--lora DIR]
              (--prompts '[[ids...], ...]' | --input in.json) [--max-new-tokens N] [--output out.json]
              prints (or writes) {"outputs": [[ids...], ...]} (one list per prompt; no --lora: the base model);
              in.json = {"prompts": [...], "max_new_tokens": N, "loras"?: [DIR or null, ...]}: with "loras",
              outputs has one such list per adapter (null: the base model), [adapter][prompt][token].

The four adapters differ in every way the worker reads (SPECS): ranks 4, 8,
16 and 12 (not a power of two: padded to the slot rank on the kernel path),
one with use_rslora (scaling alpha / sqrt(r)), one on q_proj and v_proj only,
one on all seven projections, one on the MLP only, and one restricted by
layers_to_transform. PEFT's own init for init_lora_weights=False is small
next to random_models.py's weights (gain 3 per layer), so A and B are
redrawn (seeded) with a gain that makes each adapter change greedy output.

The reference is the adapter merged into the base (PeftModel.merge_and_unload)
and transformers' greedy generate, one prompt at a time (hf_reference.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
# Relative size of the redrawn B: the adapter's delta next to the base weight (both ~ gain / sqrt(fan_in)).
DELTA_GAIN = 1.5


@dataclass(frozen=True)
class LoraSpec:
    r: int
    lora_alpha: int
    target_modules: tuple[str, ...]
    use_rslora: bool = False
    layers_to_transform: tuple[int, ...] | None = None
    rank_pattern: tuple[tuple[str, int], ...] = ()  # PEFT's rank_pattern / alpha_pattern, as (pattern, value) pairs
    alpha_pattern: tuple[tuple[str, int], ...] = ()


SPECS: dict[str, LoraSpec] = {
    "a1": LoraSpec(4, 8, ("q_proj", "v_proj")),
    "a2": LoraSpec(8, 16, tuple(ATTENTION + MLP), use_rslora=True),
    "a3": LoraSpec(16, 16, tuple(MLP)),
    "a4": LoraSpec(12, 24, ("k_proj", "o_proj", "up_proj"), layers_to_transform=(1,)),
}


def make_lora_dir(base_dir: str | Path, out_dir: str | Path, spec: LoraSpec, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model

    from hf_reference import load_model

    out = Path(out_dir)
    model = load_model(base_dir, "float32")
    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.lora_alpha,
        target_modules=list(spec.target_modules),
        use_rslora=spec.use_rslora,
        layers_to_transform=list(spec.layers_to_transform) if spec.layers_to_transform else None,
        rank_pattern=dict(spec.rank_pattern),
        alpha_pattern=dict(spec.alpha_pattern),
        lora_dropout=0.0,
        init_lora_weights=False,
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    scaling = spec.lora_alpha / (spec.r**0.5 if spec.use_rslora else spec.r)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if ".lora_A." in name:  # [r, in]
                param.copy_(torch.randn(param.shape, generator=generator) / param.shape[1] ** 0.5)
            elif ".lora_B." in name:  # [out, r]: scaled so that scaling * B @ A has about DELTA_GAIN / sqrt(in)
                param.copy_(torch.randn(param.shape, generator=generator) * DELTA_GAIN / (scaling * param.shape[1] ** 0.5))
    peft_model.save_pretrained(out)
    return out


# Adapters a worker refuses with the CLI's defaults (--max-lora-rank 16).
REFUSED_SPECS: dict[str, LoraSpec] = {"rank32": LoraSpec(32, 32, ("q_proj",))}


def make_lora_dirs(base_dir: str | Path, out_dir: str | Path, specs: dict[str, LoraSpec] = SPECS) -> dict[str, Path]:
    """specs built into out_dir/<name>, each seeded by its name."""
    return {
        name: make_lora_dir(base_dir, Path(out_dir) / name, spec, zlib.crc32(f"lora/{name}".encode()))
        for name, spec in specs.items()
    }


def merged_model(base, lora_dir: str | Path):
    """The adapter merged into a copy of the loaded base model (transformers + PEFT's own merge)."""
    from peft import PeftModel

    merged = PeftModel.from_pretrained(copy.deepcopy(base), str(lora_dir)).merge_and_unload()
    merged.eval()
    return merged


def peft_greedy(base_dir, lora_dir, prompts: list[list[int]], max_new_tokens: int, base=None) -> list[list[int]]:
    """transformers greedy outputs of the merged model (lora_dir None: of the base itself)."""
    from hf_reference import hf_greedy, load_model

    base = base if base is not None else load_model(base_dir, "float32")
    model = merged_model(base, lora_dir) if lora_dir is not None else base
    return hf_greedy(base_dir, prompts, max_new_tokens, model=model)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="a base model directory built by random_models.py")
    parser.add_argument("--out", help="where to build the adapters a1..a4")
    parser.add_argument("--reference", action="store_true", help="print the merged model's greedy outputs instead")
    parser.add_argument("--lora", help="--reference: the adapter directory (omit for the base model)")
    parser.add_argument("--prompts", help="--reference: JSON list of token id lists")
    parser.add_argument("--input", help="--reference: JSON file {prompts, max_new_tokens}")
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--output", help="--reference: write the JSON here instead of stdout")
    parser.add_argument("--bench", type=int, help="build N adapters lora0.. (rank 16 on all seven projections) for bench/lora_bench.mjs instead")
    args = parser.parse_args(argv)
    if args.reference:
        spec = json.loads(Path(args.input).read_text()) if args.input else {}
        prompts = spec.get("prompts") if args.input else json.loads(args.prompts or "null")
        if not prompts:
            parser.error("--reference needs --prompts or --input")
        new_tokens = int(spec.get("max_new_tokens", args.max_new_tokens))
        if "loras" in spec:
            from hf_reference import load_model

            base = load_model(args.base, "float32")
            outputs = [peft_greedy(args.base, lora, prompts, new_tokens, base=base) for lora in spec["loras"]]
        else:
            outputs = peft_greedy(args.base, args.lora, prompts, new_tokens)
        text = json.dumps({"outputs": outputs})
        if args.output:
            Path(args.output).write_text(text)
        else:
            print(text)
        return 0
    if not args.out:
        parser.error("--out is required (or --reference)")
    if args.bench is not None:
        specs = {f"lora{i}": LoraSpec(16, 32, tuple(ATTENTION + MLP)) for i in range(args.bench)}
        print(json.dumps({"adapters": {name: str(path) for name, path in make_lora_dirs(args.base, args.out, specs).items()}}))
        return 0
    dirs = make_lora_dirs(args.base, args.out)
    refused = make_lora_dirs(args.base, args.out, REFUSED_SPECS)
    print(json.dumps({"adapters": {name: str(path) for name, path in dirs.items()},
                      "refused": {name: str(path) for name, path in refused.items()}}))
    return 0


if __name__ == "__main__":
    # Run as a script: the sibling helpers (hf_reference.py) sit next to this file.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(sys.argv[1:]))
