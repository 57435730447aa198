"""Builds the demo text-to-speech model directory (random weights, real architectures).

CLI: python -m baton_worker.models.demo_tts.build --out models/demo-tts

    OUT/config.json          BatonDemoTTS: the llm sub-directory, codec, stream and token settings (spec.py)
    OUT/codec.safetensors    the codec's weights (codec.py), float32
    OUT/llm/                 an HF LlamaForCausalLM directory: config.json,
                             generation_config.json (eos = end-of-audio),
                             model.safetensors, tokenizer.json, tokenizer_config.json

Deterministic (fixed seeds, torch only: no transformers or tokenizers needed,
so it runs with the worker's own requirements): two builds are byte-identical,
and files already up to date are not rewritten.

The LLM: hidden 256, 4 layers, 4 heads, 2 KV heads, head_dim 64, MLP 768,
vocab 585, untied lm_head, about 3.4M parameters. Embeddings have std 1 and
every projection std GAIN/sqrt(fan_in) (as the demo LLM does) so greedy output
varies. lm_head rows give logits of std about 3 for audio codes and half that
for text and control tokens, so the model mostly speaks codes (~95% of its
tokens); end-of-audio's row is scaled to 0.6 of that, which makes seeded
sampling (T = 1) end anywhere from a hundred tokens to past the cap.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save

from ...model.random_weights import build_cli, DecoderShape, random_decoder_weights, write_if_changed
from .codec import random_codec_weights
from .spec import DemoTTSSpec
from .text import tokenizer_config, tokenizer_json

LLM_SEED = 20250807
CODEC_SEED = 20250808
HIDDEN = 256
LAYERS = 4
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
INTERMEDIATE = 768
MAX_POSITIONS = 4096
GAIN = 3.0
AUDIO_LOGIT_STD = 3.0
OTHER_LOGIT_SCALE = 0.5
# End-of-audio's lm_head row scale: neither never nor often sampled.
EOA_LOGIT_SCALE = 0.6


def llm_config(spec: DemoTTSSpec) -> dict:
    t = spec.tokens
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": t.vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": t.bos,
        "eos_token_id": t.end_of_audio,
        "pad_token_id": None,
        "dtype": "float32",
    }


def generation_config(spec: DemoTTSSpec) -> dict:
    return {"bos_token_id": spec.tokens.bos, "eos_token_id": spec.tokens.end_of_audio, "do_sample": False}


def llm_weights(spec: DemoTTSSpec) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(LLM_SEED)
    vocab = spec.tokens.vocab_size
    weights = random_decoder_weights(DecoderShape(vocab, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE), g, GAIN)
    head = torch.randn(vocab, HIDDEN, generator=g) * (AUDIO_LOGIT_STD / HIDDEN**0.5)
    head[: spec.tokens.audio_offset] *= OTHER_LOGIT_SCALE
    head[spec.tokens.end_of_audio] *= EOA_LOGIT_SCALE / OTHER_LOGIT_SCALE
    weights["lm_head.weight"] = head
    return {name: t.contiguous() for name, t in weights.items()}


def _json_bytes(value: dict) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def build(out: Path, spec: DemoTTSSpec | None = None) -> Path:
    spec = spec or DemoTTSSpec()
    llm = out / spec.llm_dir
    llm.mkdir(parents=True, exist_ok=True)
    files = {
        out / "config.json": _json_bytes(spec.to_config()),
        out / spec.codec_weights: save(
            random_codec_weights(spec.codec, torch.Generator().manual_seed(CODEC_SEED)), metadata={"format": "pt"}
        ),
        llm / "config.json": _json_bytes(llm_config(spec)),
        llm / "generation_config.json": _json_bytes(generation_config(spec)),
        llm / "model.safetensors": save(llm_weights(spec), metadata={"format": "pt"}),
        llm / "tokenizer.json": _json_bytes(tokenizer_json(spec.tokens)),
        llm / "tokenizer_config.json": _json_bytes(tokenizer_config(MAX_POSITIONS)),
    }
    for path, data in files.items():
        write_if_changed(path, data)
    return out


def main(argv: list[str] | None = None) -> int:
    return build_cli("python -m baton_worker.models.demo_tts.build", "build the demo TTS model", build, argv)


if __name__ == "__main__":
    sys.exit(main())
