"""bench/gpu_decode.py waits for a lent GPU; its tiny CPU preset keeps it runnable meanwhile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_decode_bench_runs_its_tiny_preset_on_cpu(tmp_path):
    out = tmp_path / "rows.json"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_decode.py"), "--preset", "tiny", "--device", "cpu", "--dtype", "float32",
           "--batch", "1", "3", "--steps", "4", "--prompt-len", "40", "--hbm-gbps", "20", "--json", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["ms_per_step"] > 0 and r["roofline_ms"] > 0 and r["weight_gb"] > 0
        assert abs(r["efficiency"] - r["roofline_ms"] / r["ms_per_step"]) < 1e-2
