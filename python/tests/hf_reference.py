"""Reference greedy outputs from transformers, for parity tests.

Library:  hf_greedy(model_dir, prompts, max_new_tokens, dtype=None, logit_bias=None, allowed_token_ids=None) -> list[list[int]]
CLI:      python python/tests/hf_reference.py --model DIR --input in.json --output out.json [--dtype float32]

in.json  = {"prompts": [[ids...], ...], "max_new_tokens": N, "logit_bias"?: {"id": bias}, "allowed_token_ids"?: [ids...]}

logit_bias runs as transformers' sequence_bias (one-token sequences), allowed_token_ids
as its prefix_allowed_tokens_fn.
out.json = {"outputs": [[ids...], ...]}

Each prompt runs alone (no padding) through model.generate(do_sample=False),
which stops at the EOS ids of generation_config.json (if any); only the new
tokens are returned, including the final EOS token when one was generated.
The model runs in the checkpoint's dtype unless --dtype says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load_model(model_dir: str | Path, dtype: str | None = None):
    import torch
    import transformers

    kwargs = {"dtype": getattr(torch, dtype)} if dtype else {"dtype": "auto"}
    architectures = json.loads((Path(model_dir) / "config.json").read_text()).get("architectures") or []
    if architectures[:1] == ["Qwen3OmniMoeForConditionalGeneration"]:
        # Text in, text out is the thinker's own generate.
        return transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(str(model_dir), **kwargs).thinker.eval()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    model.eval()
    return model


def hf_greedy(
    model_dir,
    prompts: list[list[int]],
    max_new_tokens: int,
    dtype: str | None = None,
    model=None,
    logit_bias: dict[int, float] | None = None,
    allowed_token_ids: list[int] | None = None,
):
    import torch

    model = model or load_model(model_dir, dtype)
    extra = {}
    if logit_bias:
        extra["sequence_bias"] = {(int(token),): float(bias) for token, bias in logit_bias.items()}
    if allowed_token_ids:
        extra["prefix_allowed_tokens_fn"] = lambda _batch, _ids: list(allowed_token_ids)
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt], dtype=torch.long)
            generated = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=model.generation_config.pad_token_id or 0,
                **extra,
            )
            outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="transformers greedy reference outputs")
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.input).read_text())
    outputs = hf_greedy(
        args.model,
        spec["prompts"],
        int(spec["max_new_tokens"]),
        args.dtype,
        logit_bias=spec.get("logit_bias"),
        allowed_token_ids=spec.get("allowed_token_ids"),
    )
    Path(args.output).write_text(json.dumps({"outputs": outputs}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
