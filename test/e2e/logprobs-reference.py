"""transformers' log-softmax over prompt + output, for the logprobs parity test.

Usage: python logprobs-reference.py MODEL_DIR IN.json OUT.json
IN  = {"cases": [{"prompt": [ids], "output": [ids], "k": K}, ...]}
OUT = {"cases": [{"chosen": [lp per output token], "top_ids": [[k ids]], "top_logprobs": [[k lps]]}, ...]}
One float32 forward per case over prompt + output[:-1]; position len(prompt)-1+i
predicts output[i].
"""

import json
import sys

import torch
import transformers

model_dir, in_path, out_path = sys.argv[1:4]
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
model.eval()
cases = json.load(open(in_path))["cases"]
results = []
with torch.no_grad():
    for case in cases:
        prompt, output, k = case["prompt"], case["output"], case["k"]
        ids = torch.tensor([prompt + output[:-1]], dtype=torch.long)
        logits = model(ids, attention_mask=torch.ones_like(ids)).logits[0].float()
        lps = torch.log_softmax(logits[len(prompt) - 1 :], dim=-1)
        chosen = lps.gather(1, torch.tensor(output)[:, None])[:, 0]
        values, top = torch.topk(lps, k, dim=-1)
        results.append({"chosen": chosen.tolist(), "top_ids": top.tolist(), "top_logprobs": values.tolist()})
json.dump({"cases": results}, open(out_path, "w"))
