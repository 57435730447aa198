"""Applies grammar masks with the worker's own code (token_bitmask.apply_token_bitmask)
and reports, for each case, which of the asked token ids kept a finite logit.

stdin: JSON list of {"vocab": int, "bits": [int32...], "ids": [int...]}; stdout: JSON list of [bool...]."""

import json
import sys

import numpy as np
import torch

from baton_worker.sampling.token_bitmask import apply_token_bitmask

out = []
for case in json.load(sys.stdin):
    logits = torch.zeros(1, case["vocab"])
    apply_token_bitmask(logits, np.array([0]), np.array(case["bits"], np.int32))
    finite = torch.isfinite(logits[0]).numpy()
    out.append([bool(finite[i]) for i in case["ids"]])
json.dump(out, sys.stdout)
