"""The model worker alone on a serving workload: how fast is it without the
engine, the sockets and HTTP?

Replays `baton bench serve`'s random workload (--requests prompts of
--prompt-len random tokens, --output-len new tokens each, at most
--concurrency running at once) straight into a StepRunner, scheduled as the
engine does (decodes first, then prefill chunks within --token-budget;
python/tests/engine_sim.py, which also round-trips every message through the
wire codec). Prints output tokens/s per round and the worker's own per-step
time (prepare / forward / sample, as StepResult.timings reports them); with
--profile, the torch operators that took the most CPU in one more round.

Comparing its tokens/s with `baton bench serve` on the same model says how
much the server around the worker costs; the profile says where the worker's
time goes (docs/benchmarks.md, "What bounds the ratio on this machine").

  .venv/bin/python bench/worker_workload.py --model /tmp/llama-19m --temperature 0 [--profile]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "python" / "tests")]

from baton_worker.sampling.head_screen import HeadScreen, int8_products_are_exact  # noqa: E402
from baton_worker.runtime.loading import load_worker  # noqa: E402
from baton_worker.runtime.options import parse_options  # noqa: E402
from baton_worker.protocol import SamplingParams  # noqa: E402
from engine_sim import EngineSim, SimRequest  # noqa: E402

BLOCK_SIZE = 16


def run_round(runner, args, first_id: int, rng: np.random.Generator) -> dict:
    params = SamplingParams(temperature=args.temperature)
    vocab = runner.vocab_size
    requests = [SimRequest(first_id + i, rng.integers(0, vocab, args.prompt_len).tolist(), args.output_len, params) for i in range(args.requests)]
    for r in requests:
        r.tokens = list(r.prompt)
    sim = EngineSim(runner, BLOCK_SIZE, args.num_blocks, token_budget=args.token_budget)
    parts = np.zeros(3)
    start = time.perf_counter()
    while not all(r.done for r in requests):
        sim.step([r for r in requests if not r.done][: args.concurrency])
        t = sim.results[-1].timings
        parts += (t.prepare_ms, t.forward_ms, t.sample_ms)
    seconds = time.perf_counter() - start
    steps = sim.step_id
    return {
        "output_tokens_per_s": args.requests * args.output_len / seconds,
        "steps": steps,
        "ms_per_step": seconds * 1e3 / steps,
        "prepare_ms_per_step": parts[0] / steps,
        "forward_ms_per_step": parts[1] / steps,
        "sample_ms_per_step": parts[2] / steps,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--token-budget", type=int, default=2048, help="tokens per step (the engine's --max-num-batched-tokens)")
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="one more round under torch.profiler; print its top operators")
    parser.add_argument("--json", help="write the rounds here")
    parser.add_argument("--head-screen", choices=("on", "off", "both", "kinds"), default="on",
                        help="the head's screen (head_screen.py) in this CPU's native kind; both: rounds alternate off and on, "
                             "side by side; kinds: off, bfloat16 and int8 in turn")
    args = parser.parse_args(argv)

    opts = parse_options(["--model", args.model, "--in-endpoint", "ipc:///unused-in", "--out-endpoint", "ipc:///unused-out",
                          "--block-size", str(BLOCK_SIZE), "--num-blocks", str(args.num_blocks)])
    runner = load_worker(opts).runner
    head = runner.model.lm_head
    screens = {"off": None, "on": head.screen}
    if args.head_screen == "kinds":
        weight = head.weight if head.weight is not None else head.transposed.t()
        screens.update({kind: HeadScreen(weight, kind) for kind in ("bfloat16", "int8")})
        if not int8_products_are_exact():
            sys.exit("--head-screen kinds: this CPU's int8 GEMM saturates (no VNNI); the int8 screen would be wrong here")
    elif args.head_screen != "off" and head.screen is None:
        print("no head screen on this machine (needs a float32 head and a CPU with VNNI, AVX512-BF16 or AMX)", file=sys.stderr)
    modes = {"on": ["on"], "off": ["off"], "both": ["off", "on"], "kinds": ["off", "bfloat16", "int8"]}[args.head_screen]
    rng = np.random.default_rng(0)
    warm = argparse.Namespace(**{**vars(args), "requests": min(args.requests, args.concurrency)})
    run_round(runner, warm, 0, rng)  # first-call costs (allocations, oneDNN primitives) stay out of the rounds
    rounds = []
    print(f"{'round':>5} {'screen':>8} {'tok/s':>8} {'steps':>6} {'ms/step':>8} {'prepare':>8} {'forward':>8} {'sample':>8}")
    for i in range(args.rounds * len(modes)):
        mode = modes[i % len(modes)]
        head.screen = screens[mode]
        r = run_round(runner, args, (i + 1) * 1_000_000, rng)
        r["head_screen"] = mode
        rounds.append(r)
        print(f"{i + 1:>5} {mode:>8} {r['output_tokens_per_s']:>8.0f} {r['steps']:>6} {r['ms_per_step']:>8.2f} "
              f"{r['prepare_ms_per_step']:>8.2f} {r['forward_ms_per_step']:>8.2f} {r['sample_ms_per_step']:>8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1))
    if args.profile:
        from torch.profiler import profile

        with profile() as prof:
            run_round(runner, args, (len(rounds) + 1) * 1_000_000, rng)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
