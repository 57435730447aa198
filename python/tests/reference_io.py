"""The stdin/stdout form of the transformers reference scripts (llava_reference.py,
qwen2_5_vl_reference.py): a JSON request in, {"results": [...]} out."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable


def main(reference: Callable[[str, list[dict], int], list[dict]]) -> int:
    request = json.load(sys.stdin)
    results = reference(request["model_dir"], request["cases"], request["max_new_tokens"])
    json.dump({"results": results}, sys.stdout)
    return 0
