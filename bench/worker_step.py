"""The model worker's own time per decode step, old path vs new, in one run.

Drives a StepRunner directly (no engine, no sockets): B requests with
--prompt-len random prompt tokens are prefilled in chunks, then every step
decodes one token for all B rows; the table shows the median wall time of
runner.execute() per decode step and its parts (prepare / forward / sample
as the worker reports them in StepResult.timings).

  old: reference attention (per-row SDPA loop) and unfused q/k/v, gate/up
  new: the device's default backend (cpu on CPU) and fused weights

  git:REV (with --before REV [REV ...]): the worker as it was at git
      revision REV, run from `git archive` in a child process (the true "before")

"old" uses today's persistent batch, so it understates the old worker's
batch-building cost; --before measures that too. The attn column is the
time spent inside the attention backend (prepare + run, all layers); it is
not available for git:REV. Usage:
  .venv/bin/python bench/worker_step.py [--model models/demo] [--batch 1 32 256]
      [--threads 1 2] [--steps 10] [--temperature 0] [--before c486cff 363496a] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if "BATON_BENCH_SOURCE" not in os.environ:  # a git:REV child imports the old tree from PYTHONPATH
    sys.path.insert(0, str(ROOT / "python"))

from baton_worker.runtime.loading import load_worker  # noqa: E402
from baton_worker.runtime.options import WorkerOptions  # noqa: E402
from baton_worker.protocol import AddedRequest, SamplingParams, Step  # noqa: E402
try:
    from baton_worker.runtime.server import set_cpu_threads  # noqa: E402
except ImportError:  # a git:REV child from before the worker chose its threads
    set_cpu_threads = torch.get_num_threads

PATHS = {"old": dict(attention_backend="reference", fuse_weights=False), "new": dict(attention_backend="auto", fuse_weights=True)}


def i32(values) -> np.ndarray:
    return np.asarray(values, np.int32)


class Driver:
    """Hands out blocks and builds Steps the way the engine would."""

    def __init__(self, runner, block_size: int):
        self.runner, self.block_size = runner, block_size
        self.next_block = 0
        self.step_id = 0

    def step(self, added, rows):
        """rows: list of (req_id, num_new, num_computed, pages held, sample)."""
        counts, ids = [], []
        for _req, n, computed, held, _s in rows:
            need = max(-(-(computed + n) // self.block_size) - held[0], 0)
            counts.append(need)
            ids += range(self.next_block, self.next_block + need)
            self.next_block += need
            held[0] += need
        step = Step(self.step_id, added, i32([]), i32([r[0] for r in rows]), i32([r[1] for r in rows]),
                    i32([r[2] for r in rows]), i32(counts), i32(ids), np.array([r[4] for r in rows], np.uint8))
        self.step_id += 1
        return self.runner.execute(step)


def _timed(obj, name: str, spent: list[float]) -> None:
    inner = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    setattr(obj, name, wrapper)


def measure(model: str, path: str, batch: int, prompt_len: int, steps: int, temperature: float, block_size: int, dtype: str = "auto") -> dict:
    pages = -(-(prompt_len + steps + 8) // block_size)
    opts = WorkerOptions(model=model, in_endpoint="", out_endpoint="", block_size=block_size, num_blocks=batch * pages + 8, dtype=dtype)
    runner = load_worker(opts, **PATHS[path]).runner if path in PATHS else load_worker(opts).runner
    spent = [0.0]
    if getattr(runner, "attention", None) is not None:
        _timed(runner.attention, "prepare", spent)
        _timed(runner.attention, "run", spent)
    vocab = runner.vocab_size
    rng = np.random.default_rng(0)
    driver = Driver(runner, block_size)
    sampling = SamplingParams(temperature=temperature, seed=None)
    held = [[0] for _ in range(batch)]
    lengths = [prompt_len] * batch
    # Prefill in chunks of whole prompts, about 2048 tokens per step.
    per_step = max(1, 2048 // prompt_len)
    for first in range(0, batch, per_step):
        ids = range(first, min(batch, first + per_step))
        added = [AddedRequest(i, i32(rng.integers(0, vocab, prompt_len)), prompt_len, sampling) for i in ids]
        result = driver.step(added, [(i, prompt_len, 0, held[i], 1) for i in ids])
        for i in result.req_ids.tolist():
            lengths[i] += 1
    times, parts, attn = [], [], []
    for n in range(steps + 3):
        spent[0] = 0.0
        rows = [(i, 1, lengths[i] - 1, held[i], 1) for i in range(batch)]
        t0 = time.perf_counter()
        result = driver.step([], rows)
        elapsed = (time.perf_counter() - t0) * 1e3
        for i in result.req_ids.tolist():
            lengths[i] += 1
        if n >= 3:  # warm-up steps excluded
            times.append(elapsed)
            attn.append(spent[0] * 1e3)
            parts.append((result.timings.prepare_ms, result.timings.forward_ms, result.timings.sample_ms))
    med = lambda xs: statistics.median(xs)  # noqa: E731
    return {"ms": med(times), "attn": med(attn) if spent[0] else None, "prepare": med(p[0] for p in parts), "forward": med(p[1] for p in parts), "sample": med(p[2] for p in parts)}


def measure_at_revision(rev: str, args, batch: int, threads: int) -> dict:
    """The same measurement with the worker code of git revision `rev`, in a child process."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "python", "protocol"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        env = dict(os.environ, BATON_BENCH_SOURCE=rev, PYTHONPATH=f"{tmp}/python", BATON_SCHEMA=f"{tmp}/protocol/schema.json")
        cmd = [sys.executable, __file__, "--child", "--model", args.model, "--batch", str(batch), "--threads", str(threads),
               "--prompt-len", str(args.prompt_len), "--steps", str(args.steps), "--temperature", str(args.temperature),
               "--block-size", str(args.block_size), "--dtype", args.dtype]
        child = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if child.returncode != 0:
            raise RuntimeError(f"measuring {rev} failed:\n{child.stderr}")
        return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(Path(__file__).resolve().parent.parent / "models" / "demo"))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--paths", nargs="+", default=["old", "new"], choices=list(PATHS))
    parser.add_argument("--threads", type=int, nargs="+", default=[set_cpu_threads()], help="default: the worker's own choice")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", default="auto", help="the worker's --dtype (auto: the checkpoint's)")
    parser.add_argument("--before", metavar="REV", nargs="+", default=[], help="also measure the worker at these git revisions (e.g. c486cff)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        torch.set_num_threads(args.threads[0])
        r = measure(args.model, "git", args.batch[0], args.prompt_len, args.steps, args.temperature, args.block_size, args.dtype)
        print(json.dumps(r))
        return
    print(f"model {args.model}, dtype {args.dtype}, prompt {args.prompt_len} tokens, {args.steps} timed decode steps (median), "
          f"temperature {args.temperature}, torch {torch.__version__}")
    print(f"{'threads':>7} {'B':>5} {'path':>12} {'ms/step':>9} {'prepare':>8} {'forward':>8} {'attn':>8} {'sample':>8} {'vs new':>8}")
    paths = [f"git:{rev}" for rev in args.before] + args.paths
    for threads in args.threads:
        torch.set_num_threads(threads)
        for batch in args.batch:
            results = {}
            for path in paths:
                if path.startswith("git:"):
                    r = measure_at_revision(path.removeprefix("git:"), args, batch, threads)
                else:
                    r = measure(args.model, path, batch, args.prompt_len, args.steps, args.temperature, args.block_size, args.dtype)
                results[path] = r
            for path, r in results.items():
                ratio = f"{r['ms'] / results['new']['ms']:.2f}x" if "new" in results else ""
                attn = f"{r['attn']:.2f}" if r["attn"] is not None else "-"
                print(f"{threads:>7} {batch:>5} {path:>12} {r['ms']:>9.2f} {r['prepare']:>8.2f} {r['forward']:>8.2f} {attn:>8} {r['sample']:>8.2f} {ratio:>8}", flush=True)


if __name__ == "__main__":
    main()
