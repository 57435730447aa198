"""bench/worker_workload.py replays a serving workload into the worker alone; a small run keeps it working."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_worker_workload_bench_runs_every_request_to_its_length(tmp_path):
    from baton_worker.sampling.head_screen import int8_products_are_exact

    # kinds: off, bfloat16 and int8 in turn, where int8 products are exact (VNNI); else off and on.
    mode, modes = ("kinds", ["off", "bfloat16", "int8"]) if int8_products_are_exact() else ("both", ["off", "on"])
    out = tmp_path / "rounds.json"
    cmd = [sys.executable, str(ROOT / "bench" / "worker_workload.py"), "--model", str(ROOT / "models" / "demo"),
           "--requests", "5", "--concurrency", "2", "--prompt-len", "20", "--output-len", "3", "--token-budget", "16",
           "--rounds", "2", "--temperature", "1", "--head-screen", mode, "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    rounds = json.loads(out.read_text())["rounds"]
    assert [r["head_screen"] for r in rounds] == modes * 2
    for r in rounds:
        # 5 prompts of 20 tokens in chunks of at most 16, 2 at a time: more steps than decodes alone.
        assert r["steps"] > 5 * 3 / 2
        assert r["output_tokens_per_s"] > 0 and r["forward_ms_per_step"] > 0
        assert r["ms_per_step"] >= r["prepare_ms_per_step"] + r["forward_ms_per_step"] + r["sample_ms_per_step"]
