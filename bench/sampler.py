"""Time per Sampler.sample() call, the per-row sampler it replaced vs the batched one, side by side.

    .venv/bin/python bench/sampler.py [--rows 1,32,256] [--vocab 151936] [--steps 5]

Each case runs `steps` consecutive decode steps on the same requests (so
penalty bookkeeping sees one new token per step, as in serving) after one
warm-up step; the best time of each is printed (the machine is shared:
the best is the least disturbed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "python" / "tests")]

from baton_worker.protocol import SamplingParams  # noqa: E402
from baton_worker.runtime.request_state import RequestState  # noqa: E402
from baton_worker.sampling.sampler import Sampler  # noqa: E402
from test_sampler_reference import ReferenceSampler  # noqa: E402

CASES = {
    "greedy": lambda i: SamplingParams(temperature=0.0),
    "temp 1.0": lambda i: SamplingParams(temperature=1.0),
    "temp 0.7 top_p 0.9 top_k 50": lambda i: SamplingParams(temperature=0.7, top_p=0.9, top_k=50),
    "temp 1.0 repetition 1.1": lambda i: SamplingParams(temperature=1.0, repetition_penalty=1.1),
    "temp 1.0 50% seeded": lambda i: SamplingParams(temperature=1.0, seed=i if i % 2 else None),
    "temp 1.0 logprobs 5": lambda i: SamplingParams(temperature=1.0, logprobs=5),
}


def time_case(params, rows: int, vocab: int, steps: int) -> tuple[float, float]:
    """(old ms, new ms) per call, best of `steps`; the two run alternately on the same logits."""
    gen = torch.Generator().manual_seed(rows)
    device = torch.device("cpu")
    prompts = [torch.randint(vocab, (128,), generator=gen).tolist() for _ in range(rows)]
    samplers = [ReferenceSampler(0, device), Sampler(0, device)]
    states = [[RequestState(i, list(prompts[i]), 128, params(i)) for i in range(rows)] for _ in samplers]
    times: list[list[float]] = [[], []]
    for step in range(steps + 1):
        logits = torch.randn(rows, vocab, generator=gen) * 2
        for j in (0, 1) if step % 2 else (1, 0):
            t0 = time.perf_counter()
            out = samplers[j].sample(logits, states[j])
            if step:
                times[j].append(time.perf_counter() - t0)
            for st, token in zip(states[j], out.token_ids.tolist()):
                st.token_ids.append(token)
    return min(times[0]) * 1e3, min(times[1]) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,32,256")
    ap.add_argument("--vocab", type=int, default=151936)  # the demo model's (Qwen3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, vocab {args.vocab}, best of {args.steps} steps, old and new alternating")
    print(f"| case | rows | per-row (old) ms | batched (new) ms | speedup |")
    print(f"|---|---:|---:|---:|---:|")
    for name in args.cases.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            old, new = time_case(CASES[name], rows, args.vocab, args.steps)
            print(f"| {name} | {rows} | {old:.2f} | {new:.2f} | {old / new:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
