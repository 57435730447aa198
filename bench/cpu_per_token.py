"""CPU time per output token of each process of a serving run: where the cores go.

Starts a server (Baton, or transformers serve as `baton bench compare --peer
transformers` runs it), runs `baton bench serve` against it once, and reads
every process's user+system CPU time from /proc before and after (the server's
whole process tree, and the load generator's own). With C cores, no server can
go faster than C / (CPU seconds per token summed over the processes that share
them), so this says what bounds the output tokens/s on a small machine.

    .venv/bin/python bench/cpu_per_token.py --server baton --model /tmp/llama-19m --temperature 1
    .venv/bin/python bench/cpu_per_token.py --server transformers --model /tmp/llama-19m
        [--num-prompts 128] [--concurrency 32] [--input-len 128] [--output-len 64] [--seed 5000]
        [--serve-args "..."]

Linux only (/proc). Every process it starts is in its own process group,
stopped with SIGTERM (SIGKILL after 15 s) also when the run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (its threads included), 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def tree(pid: int) -> dict[int, str]:
    """pid -> command name for pid and all its descendants."""
    found = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            found[p] = Path(f"/proc/{p}/comm").read_text().strip()
            # Children of every thread (Baton's worker is spawned from its engine thread).
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def wait_ready(url: str, timeout: float, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not ready at {url} after {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", choices=["baton", "transformers"], required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=5000)
    ap.add_argument("--serve-args", default="", help="extra `baton serve` flags")
    args = ap.parse_args()

    load_before = Path("/proc/loadavg").read_text().split()[0]
    port = free_port()
    python = str(ROOT / ".venv" / "bin" / "python")
    env = dict(os.environ)
    if args.server == "baton":
        cmd = ["node", str(ROOT / "bin" / "baton.mjs"), "serve", args.model, "--port", str(port), *shlex.split(args.serve_args)]
        model_name = None
    else:
        cmd = [python, "-m", "transformers.cli.transformers", "serve", args.model, "--device", "cpu", "--dtype", "float32",
               "--continuous-batching", "--no-cb-use-cuda-graph", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        model_name = args.model
    # Output to a file: an unread pipe fills up and blocks a chatty server.
    log = tempfile.TemporaryFile()
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", 600, server)  # transformers serve answers 500 to /v1/models offline
        processes = tree(server.pid)
        with tempfile.TemporaryDirectory() as out:
            bench = ["node", str(ROOT / "bin" / "baton.mjs"), "bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
                     "--tokenizer", args.model, "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency),
                     "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
                     "--temperature", str(args.temperature), "--seed", str(args.seed), "--save-result", "--result-dir", out,
                     "--result-filename", "r.json", "--disable-tqdm"]
            if model_name:
                bench += ["--model", model_name]
            client_log = tempfile.TemporaryFile()
            client = subprocess.Popen(bench, stdout=subprocess.DEVNULL, stderr=client_log, start_new_session=True)
            # CPU of every process every 50 ms, to cut out the measured window afterwards
            # (the load generator also loads a tokenizer and makes prompts before it).
            samples = []
            while client.poll() is None:
                samples.append((time.monotonic(), cpu_seconds(client.pid), {p: cpu_seconds(p) for p in processes}))
                time.sleep(0.05)
            end = time.monotonic()
            if client.returncode != 0:
                client_log.seek(0)
                raise RuntimeError(f"bench serve failed: {client_log.read().decode()[-2000:]}")
            result = json.loads((Path(out) / "r.json").read_text())
        wall = result["duration"]
        start = min(samples, key=lambda s: abs(s[0] - (end - wall)))
        last = samples[-1]
        # The load generator's last sample is at most 50 ms before it exited.
        client_cpu = last[1] - start[1]
        after = {p: cpu_seconds(p) for p in processes}
        before = start[2]
    finally:
        stop(server)
    tokens = result["total_output_tokens"]
    print(f"{args.server}, temperature {args.temperature}: {tokens} output tokens in {wall:.1f} s "
          f"({result['output_throughput']:.0f} tok/s), {os.cpu_count()} cores, load average before {load_before}")
    rows = {}
    for p, name in processes.items():
        rows.setdefault(name, 0.0)
        rows[name] += after[p] - before[p]
    rows["load generator (node)"] = client_cpu  # (its last 50 ms may be missing)
    total = sum(rows.values())
    print(f"{'process':>24} {'CPU s':>8} {'ms CPU / token':>15} {'cores busy':>11}")
    for name, spent in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"{name:>24} {spent:>8.2f} {spent / tokens * 1e3:>15.3f} {spent / wall:>11.2f}")
    print(f"{'all':>24} {total:>8.2f} {total / tokens * 1e3:>15.3f} {total / wall:>11.2f}")
    cores = len(os.sched_getaffinity(0))
    print(f"bound with {cores} cores and this CPU per token: {cores / (total / tokens):.0f} tok/s")


if __name__ == "__main__":
    sys.exit(main())
