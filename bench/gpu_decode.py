"""Decode ms/step against the memory-bandwidth roofline (step 2 of bench/gpu/run.sh).

Drives the worker's StepRunner directly (no engine, no sockets, so no Node or
pyzmq on the GPU machine) on a random-weight model of a real shape
(--load-format dummy: the weights come from the config, no files): for each
batch size B, B requests with --prompt-len random prompt tokens are prefilled,
then --steps decode steps for all B rows are timed (median), and the roofline
is what one decode step must read from HBM at --hbm-gbps:

  weights (every parameter but the embedding table, of which B rows are read)
  + KV read (each row's whole context, K and V, every layer) + KV written

  efficiency = roofline ms / measured ms   (the target: >= 0.85 at B=1)

--profile B... also records 32 decode steps at each of those batch sizes with
torch.profiler and prints the GPU's busy fraction over them (the rest is idle
time the host left), its longest idle gaps and the kernels that took the most
time, and writes Chrome traces.

  python bench/gpu_decode.py --preset llama3-8b --device cuda --batch 1 2 4 8 16 32 64 128 256 --profile 1 128
  python bench/gpu_decode.py --preset tiny --device cpu --batch 1 4   # the script's own check, anywhere
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

from baton_worker.runtime.loading import load_worker, resolve_device  # noqa: E402
from baton_worker.runtime.options import WorkerOptions  # noqa: E402
from baton_worker.protocol import AddedRequest, SamplingParams, Step  # noqa: E402

PRESETS = {
    # Meta-Llama-3-8B's shape.
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False),
    # Qwen3-30B-A3B's shape (the Qwen3-Omni thinker's kind of decoder: 128 experts, 8 per token) cut to 12 of its
    # 48 layers, so the weights (15 GB) leave room for the cache; ms/step scales with the layers.
    "qwen3-moe-12l": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=12, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
                          tie_word_embeddings=False, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=128,
                          num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
    # Small enough for a CPU: checks the script, not the hardware.
    "tiny": dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, rope_theta=10000.0, tie_word_embeddings=True),
}


def model_dir(preset: str, out: Path) -> Path:
    shape = dict(PRESETS[preset])
    config = {"architectures": shape.pop("architectures", ["LlamaForCausalLM"]), "model_type": shape.pop("model_type", "llama"), "rms_norm_eps": 1e-5, "hidden_act": "silu",
              "attention_bias": False, "mlp_bias": False, "bos_token_id": None, "eos_token_id": None, "dtype": "bfloat16",
              "rope_parameters": {"rope_type": "default", "rope_theta": shape.pop("rope_theta")}, **shape}
    (out / "config.json").write_text(json.dumps(config))
    return out


def i32(values) -> np.ndarray:
    return np.asarray(values, np.int32)


class Session:
    """Adds, steps and removes requests the way the engine would, on one runner."""

    def __init__(self, runner, block_size: int, num_blocks: int):
        self.runner, self.block_size = runner, block_size
        self.free = list(range(num_blocks - 1, -1, -1))
        self.step_id = 0
        self.next_req = 0

    def run(self, batch: int, prompt_len: int, steps: int, vocab: int, decode_span=None) -> list[float]:
        """Prefills `batch` requests, times `steps` decode steps (ms each), removes them.
        decode_span: a context manager entered around the decode steps only (a profiler)."""
        rng = np.random.default_rng(self.next_req)
        ids = list(range(self.next_req, self.next_req + batch))
        self.next_req += batch
        pages = {i: [] for i in ids}
        length = {i: prompt_len for i in ids}
        greedy = SamplingParams(temperature=0.0)
        per_step = max(1, 4096 // prompt_len)
        for first in range(0, batch, per_step):
            chunk = ids[first : first + per_step]
            added = [AddedRequest(i, i32(rng.integers(0, vocab, prompt_len)), prompt_len, greedy) for i in chunk]
            self._step(added, [(i, prompt_len, 0) for i in chunk], pages, length)
        with decode_span if decode_span is not None else contextlib.nullcontext():
            times = self._decode(ids, steps, pages, length)
        removed = Step(self.step_id, [], i32(ids), i32([]), i32([]), i32([]), i32([]), i32([]), np.zeros(0, np.uint8))
        self.step_id += 1
        self.runner.execute(removed)
        for i in ids:
            self.free += pages[i]
        return times

    def _decode(self, ids: list[int], steps: int, pages, length) -> list[float]:
        """Decode steps as the server runs them: with overlap (the runner's default
        on CUDA) step n + 1 is launched before step n is finished, so a step's
        time is the interval between two consecutive results."""
        overlap = self.runner.overlap
        times, pending, last = [], None, time.perf_counter()
        for _ in range(steps):
            launched = self._launch([], [(i, 1, length[i] - 1) for i in ids], pages, length)
            if pending is not None or not overlap:
                done = (pending or launched).finish()
                now = time.perf_counter()
                times.append((now - last) * 1e3)
                last = now
                assert len(done.token_ids) == len(ids)
            pending = launched if overlap else None
        if pending is not None:
            pending.finish()
        return times

    def prefill_ms(self, prompt_len: int, vocab: int) -> float:
        """One request's whole prompt in one step, timed until its first token is on the host; then removed."""
        req = self.next_req
        self.next_req += 1
        pages, length = {req: []}, {req: prompt_len}
        prompt = i32(np.random.default_rng(req).integers(0, vocab, prompt_len))
        t0 = time.perf_counter()
        self._step([AddedRequest(req, prompt, prompt_len, SamplingParams(temperature=0.0))], [(req, prompt_len, 0)], pages, length)
        ms = (time.perf_counter() - t0) * 1e3
        self.runner.execute(Step(self.step_id, [], i32([req]), i32([]), i32([]), i32([]), i32([]), i32([]), np.zeros(0, np.uint8)))
        self.step_id += 1
        self.free += pages[req]
        return ms

    def _step(self, added, rows, pages, length) -> None:
        self._launch(added, rows, pages, length).finish()

    def _launch(self, added, rows, pages, length):
        """Launches a step whose rows all sample; each row's length counts its coming token at once."""
        counts, blocks = [], []
        for req, n, computed in rows:
            need = max(-(-(computed + n) // self.block_size) - len(pages[req]), 0)
            got = [self.free.pop() for _ in range(need)]
            pages[req] += got
            counts.append(need)
            blocks += got
        step = Step(self.step_id, added, i32([]), i32([r[0] for r in rows]), i32([r[1] for r in rows]), i32([r[2] for r in rows]),
                    i32(counts), i32(blocks), np.ones(len(rows), np.uint8))
        self.step_id += 1
        launched = self.runner.launch(step)
        for req, _, _ in rows:
            length[req] += 1
        return launched


def copy_bandwidth_gbps(device: torch.device) -> float:
    """Bytes read plus written per second by a large device-to-device copy (the roofline's bandwidth)."""
    if device.type != "cuda":
        src = torch.ones(1 << 28, dtype=torch.uint8)
        dst = torch.empty_like(src)
        dst.copy_(src)
        t0 = time.perf_counter()
        dst.copy_(src)
        return 2 * (1 << 28) / (time.perf_counter() - t0) / 1e9
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 10
    del src, dst
    return 2 * (1 << 30) / seconds / 1e9


def roofline_bytes(config, batch: int, context: int, dtype_bytes: int) -> tuple[int, int]:
    """(weight bytes, KV bytes) one decode step at `batch` rows of `context` tokens must move."""
    h, v, layers = config.hidden_size, config.vocab_size, config.num_layers
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    per_layer = h * (q + 2 * kv) + q * h + 2 * h
    moe = config.moe
    if moe is None:
        per_layer += 3 * h * config.intermediate_size
    else:
        # The experts a step reads: with uniform routing, E * (1 - (1 - k/E)^B) distinct ones of E.
        touched = moe.num_experts * (1 - (1 - moe.top_k / moe.num_experts) ** batch)
        per_layer += moe.num_experts * h + touched * 3 * h * moe.intermediate_size
    weights = int(layers * per_layer) + h + v * h + batch * h  # layers, final norm, head, B embedding rows
    kv_bytes = layers * 2 * kv * dtype_bytes * batch * (context + 1)  # read the context, write the new token
    return weights * dtype_bytes, kv_bytes


PROFILED_STEPS = 32


def idle_gaps(prof) -> dict:
    """How busy the GPU was over the profiled steps, and its longest idle gaps, from the kernels' start/end times."""
    kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    if not kernels:
        return {"kernels": 0}
    busy, last_end, gaps = 0.0, kernels[0][0], []
    for start, end in kernels:
        if start > last_end:
            gaps.append(start - last_end)
        busy += max(0.0, end - max(start, last_end))
        last_end = max(last_end, end)
    span = last_end - kernels[0][0]
    big = sorted(gaps, reverse=True)[:8]
    return {"kernels": len(kernels), "span_us": span, "busy_fraction": busy / span if span else 0.0,
            "largest_gaps_us": [round(g, 1) for g in big]}


def kernel_table(prof, steps: int, rows: int = 10) -> str:
    """The kernels that took the most GPU time: ms per step and share of the total."""
    kernels = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in kernels) or 1.0
    lines = [f"  {'kernel':<70} {'ms/step':>8} {'share':>6} {'calls/step':>10}"]
    for e in kernels[:rows]:
        lines.append(f"  {e.key[:70]:<70} {e.self_device_time_total / 1e3 / steps:>8.3f} {e.self_device_time_total / total:>6.1%} "
                     f"{e.count / steps:>10.1f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--hbm-gbps", type=float, help="memory bandwidth, GB/s (default: measured by a device-to-device copy)")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--attention-backend", default="auto")
    parser.add_argument("--prefill-len", type=int, nargs="*", default=[], help="also time one request's prefill step of these lengths")
    parser.add_argument("--profile", type=int, nargs="*", default=[], metavar="B",
                        help="torch.profiler over decode steps at these batch sizes: GPU busy fraction and the top kernels")
    parser.add_argument("--trace", default="gpu_decode_trace.json")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model = model_dir(args.preset, Path(tmp))
        pages = -(-(args.prompt_len + args.steps + 4) // args.block_size)
        num_blocks = max(args.batch) * pages + 16
        opts = WorkerOptions(model=str(model), in_endpoint="", out_endpoint="", block_size=args.block_size, num_blocks=num_blocks,
                             dtype=args.dtype, device=args.device, load_format="dummy", seed=0, enforce_eager=args.enforce_eager,
                             attention_backend=args.attention_backend)
        t0 = time.perf_counter()
        loaded = load_worker(opts)
        device = resolve_device(args.device)
        dtype = getattr(torch, args.dtype)
        print(f"{args.preset} ({args.dtype}, random weights) on {device}: loaded in {time.perf_counter() - t0:.1f} s, "
              f"{num_blocks} KV blocks of {args.block_size}, CUDA graphs: {loaded.runner.graphs is not None}", flush=True)
        config, runner = loaded.config, loaded.runner
        if args.hbm_gbps is None:
            args.hbm_gbps = copy_bandwidth_gbps(device)
            print(f"measured copy bandwidth (read + write): {args.hbm_gbps:.0f} GB/s", flush=True)
        session = Session(runner, args.block_size, num_blocks)
        session.run(min(args.batch), args.prompt_len, 3, config.vocab_size)  # warm-up (kernels, graphs, allocator)
        dtype_bytes = torch.finfo(dtype).bits // 8
        rows = []
        print(f"{'B':>5} {'ms/step':>9} {'roofline ms':>12} {'efficiency':>10} {'tok/s':>10} {'weights GB':>10} {'KV GB':>8}")
        for batch in args.batch:
            times = session.run(batch, args.prompt_len, args.steps, config.vocab_size)
            ms = statistics.median(times[2:] if len(times) > 4 else times)
            context = args.prompt_len + args.steps // 2
            weights, kv = roofline_bytes(config, batch, context, dtype_bytes)
            roof = (weights + kv) / (args.hbm_gbps * 1e9) * 1e3
            row = {"batch": batch, "ms_per_step": round(ms, 3), "roofline_ms": round(roof, 3), "efficiency": round(roof / ms, 3),
                   "tokens_per_s": round(batch / ms * 1e3, 1), "weight_gb": round(weights / 1e9, 3), "kv_gb": round(kv / 1e9, 3)}
            rows.append(row)
            print(f"{batch:>5} {ms:>9.3f} {roof:>12.3f} {roof / ms:>10.3f} {row['tokens_per_s']:>10.1f} {row['weight_gb']:>10.3f} {row['kv_gb']:>8.3f}", flush=True)
        for length in args.prefill_len:
            times = [session.prefill_ms(length, config.vocab_size) for _ in range(4)]
            print(f"prefill of one {length}-token prompt (the step that samples its first token): "
                  f"{statistics.median(times[1:]):.1f} ms median of {len(times) - 1} (first {times[0]:.1f} ms)", flush=True)
        for batch in args.profile:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            prof = profile(activities=activities)
            session.run(batch, args.prompt_len, PROFILED_STEPS, config.vocab_size, decode_span=prof)
            trace = args.trace.replace(".json", f"-b{batch}.json")
            prof.export_chrome_trace(trace)
            print(f"profile of {PROFILED_STEPS} decode steps at B={batch}: {json.dumps(idle_gaps(prof))}; trace: {trace}")
            print(kernel_table(prof, PROFILED_STEPS), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"preset": args.preset, "dtype": args.dtype, "device": str(device),
                                                   "hbm_gbps": args.hbm_gbps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
