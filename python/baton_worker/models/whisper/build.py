"""Tiny random-weight Whisper directories (WhisperForConditionalGeneration) for tests.

Library:  make_whisper_dir(out, seed=0, num_mel_bins=80) -> Path
CLI:      python -m baton_worker.models.whisper.build --out DIR [--seed N] [--num-mel-bins 80|128]

The shapes are small (d_model 64, 2 + 2 layers, 4 heads) but the sequence
lengths are Whisper's own (1500 encoder positions, 3000 mel frames, 448
decoder positions), so features and encoder outputs have real shapes.
Weights come from transformers' classes and are re-drawn from one seeded
generator so outputs vary with the input: projections std 1/sqrt(fan_in),
norms 1 +- 0.1, biases small. The encoder's embed_positions stay the
sinusoids transformers initialises them to (checkpoints hold the same table).
preprocessor_config.json is written by transformers' WhisperFeatureExtractor,
so the directory looks like an openai/whisper-* one to both sides.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

# Kept by the redraw: Whisper's encoder positions are a fixed sinusoid table.
_FIXED = ("model.encoder.embed_positions.weight",)


def _redraw(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in _FIXED:
                continue
            noise = torch.randn(param.shape, generator=g)
            if "layer_norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                param.copy_(0.1 * noise)
            elif "embed_tokens" in name:
                param.copy_(noise)
            elif "embed_positions" in name:  # the decoder's learned positions
                param.copy_(0.1 * noise)
            else:  # Linear [out, in] and Conv1d [out, in, k] weights
                fan_in = param[0].numel()
                param.copy_(noise / fan_in**0.5)


def make_whisper_dir(out: Path, seed: int = 0, num_mel_bins: int = 80) -> Path:
    """Writes config.json, model.safetensors, generation_config.json and preprocessor_config.json to `out`."""
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = WhisperConfig(
        vocab_size=51865,
        num_mel_bins=num_mel_bins,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=1500,
        max_target_positions=448,
    )
    # Every parameter but the sinusoid table is redrawn, so transformers' own (global-RNG) init leaves no trace.
    model = WhisperForConditionalGeneration(config).eval()
    _redraw(model, seed)
    model.save_pretrained(out)
    WhisperFeatureExtractor(feature_size=num_mel_bins).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton_worker.models.whisper.build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-mel-bins", type=int, default=80, choices=(80, 128))
    args = parser.parse_args(argv)
    make_whisper_dir(args.out, seed=args.seed, num_mel_bins=args.num_mel_bins)
    print(json.dumps({"model_dir": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
