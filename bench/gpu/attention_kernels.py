"""The Triton attention kernels alone, against the memory roofline.

Decode: B rows of one query each over `--context` cached tokens, Llama-3-8B's
attention shape (32 query heads, 8 KV heads, head_dim 128, bf16, block 16),
for each (keys per tile, warps) setting; the bytes a decode step of one layer
must read are its K and V (B x context x 8 heads x 128 x 2 x 2 bytes).
Prefill: one prompt of --prefill tokens through the extend kernel, timed
per layer. The reference is the measured copy bandwidth.

  python3 bench/gpu/attention_kernels.py                  # on a GPU
  python3 bench/gpu/attention_kernels.py --tiny           # the script's own check (CPU: TRITON_INTERPRET=1)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from baton_worker.attention.base import AttentionMetadata  # noqa: E402
from baton_worker.attention.triton_attention import TritonBackend  # noqa: E402
from baton_worker.attention.kv_cache import KVCache  # noqa: E402


def timed_ms(fn, device: torch.device, repeats: int) -> float:
    """Median ms of `fn` over `repeats` runs after two warm-ups. On a GPU `fn` is
    captured in a CUDA graph and its replays are timed with events, so the
    kernels' time is measured, not Python's launches."""
    for _ in range(2):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        fn = graph.replay
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_gbps(device: torch.device) -> float:
    src = torch.empty(1 << 30 if device.type == "cuda" else 1 << 26, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timed_ms(lambda: dst.copy_(src), device, 10)
    return 2 * src.numel() / (ms / 1e3) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128, 256])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--prefill", type=int, default=2048)
    parser.add_argument("--tiles", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--tiny", action="store_true", help="small shapes (a CPU check of the script)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    heads, kv_heads, head_dim, block = (32, 8, 128, 16) if not args.tiny else (4, 2, 16, 16)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    if args.tiny:
        args.batch, args.context, args.prefill, args.tiles, args.warps = [1, 3], 40, 48, [32], [4]
    repeats = 20 if device.type == "cuda" else 1
    bandwidth = copy_gbps(device)
    print(f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}: copy bandwidth {bandwidth:.0f} GB/s", flush=True)

    pages = -(-(args.context + 1) // block)
    num_blocks = max(max(args.batch) * pages, -(-args.prefill // block)) + 1
    config = SimpleNamespace(num_layers=1, num_kv_heads=kv_heads, head_dim=head_dim)
    cache = KVCache(config, num_blocks, block, dtype, device)
    cache.layers[0].normal_()
    element = torch.finfo(dtype).bits // 8
    print(f"{'B':>5} {'tile':>5} {'warps':>5} {'us/layer':>9} {'KV GB/s':>8} {'of copy':>7}")
    best = {}
    for batch in args.batch:
        rng = np.random.default_rng(batch)
        table = torch.as_tensor(rng.permutation(num_blocks - 1)[: batch * pages].reshape(batch, pages), device=device)
        seq_lens = np.full(batch, args.context + 1, np.int64)
        slots = (table[:, args.context // block] * block + args.context % block).contiguous()
        meta = AttentionMetadata(slots, np.arange(batch + 1, dtype=np.int64), seq_lens, table, block)
        q = torch.randn(batch, heads, head_dim, device=device, dtype=dtype)
        k = torch.randn(batch, kv_heads, head_dim, device=device, dtype=dtype)
        v = torch.randn_like(k)
        kv_bytes = batch * (args.context + 1) * kv_heads * head_dim * 2 * element
        for tile in args.tiles:
            for warps in args.warps:
                backend = TritonBackend(cache, heads, head_dim**-0.5, [None], tile_n=tile, num_warps=warps)
                plan = backend.prepare(meta)
                ms = timed_ms(lambda: plan.run(0, q, k, v), device, repeats)
                gbps = kv_bytes / (ms / 1e3) / 1e9
                best[batch] = max(best.get(batch, (0.0, None)), (gbps, (tile, warps)))
                print(f"{batch:>5} {tile:>5} {warps:>5} {ms * 1e3:>9.1f} {gbps:>8.0f} {gbps / bandwidth:>7.2f}", flush=True)
    for batch, (gbps, (tile, warps)) in best.items():
        print(f"decode B={batch}: best {gbps:.0f} GB/s ({gbps / bandwidth:.2f} of copy) with tile {tile}, {warps} warps")

    # One prompt through the extend kernel (the whole prompt in one step).
    n = args.prefill
    table = torch.arange(-(-n // block), device=device)[None, :]
    meta = AttentionMetadata(torch.arange(n, device=device), np.array([0, n], np.int64), np.array([n], np.int64), table, block)
    q = torch.randn(n, heads, head_dim, device=device, dtype=dtype)
    k = torch.randn(n, kv_heads, head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    flops = 4 * heads * head_dim * n * (n + 1) / 2
    for tile in args.tiles:
        for warps in args.warps:
            plan = TritonBackend(cache, heads, head_dim**-0.5, [None], tile_n=tile, num_warps=warps).prepare(meta)
            ms = timed_ms(lambda: plan.run(0, q, k, v), device, max(1, repeats // 4))
            print(f"prefill {n} tokens, tile {tile}, {warps} warps: {ms:.3f} ms/layer, {flops / (ms / 1e3) / 1e12:.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
