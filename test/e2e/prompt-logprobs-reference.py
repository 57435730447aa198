"""transformers' log-softmax over each prompt, for the prompt-logprobs e2e test.

Usage: python prompt-logprobs-reference.py IN.json OUT.json
IN  = {"cases": [{"model_dir": DIR, "prompt": [ids], "k": K}, ...]}
OUT = {"cases": [{"logprobs": [...], "ranks": [...], "top_ids": [[...]], "top_logprobs": [[...]]}, ...]}
Entry p scores prompt[p + 1] (the first prompt token has none); float32.
"""

import json
import sys

import torch
import transformers

in_path, out_path = sys.argv[1:3]
models = {}
results = []
with torch.no_grad():
    for case in json.load(open(in_path))["cases"]:
        model = models.get(case["model_dir"])
        if model is None:
            model = models[case["model_dir"]] = transformers.AutoModelForCausalLM.from_pretrained(case["model_dir"], dtype=torch.float32).eval()
        prompt, k = case["prompt"], case["k"]
        ids = torch.tensor([prompt], dtype=torch.long)
        lps = torch.log_softmax(model(ids, attention_mask=torch.ones_like(ids)).logits[0, :-1].float(), dim=-1)
        chosen = lps.gather(1, torch.tensor(prompt[1:])[:, None])
        values, top = torch.topk(lps, k, dim=-1)
        results.append({
            "logprobs": chosen[:, 0].tolist(),
            "ranks": ((lps > chosen).sum(dim=-1) + 1).tolist(),
            "top_ids": top.tolist(),
            "top_logprobs": values.tolist(),
        })
json.dump({"cases": results}, open(out_path, "w"))
