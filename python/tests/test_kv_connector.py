"""The KV connector's worker half between two real processes over torch.distributed (gloo).

Rank 0 (prefill) sends blocks of its KV cache; rank 1 (decode) loads them into
other block ids: the bytes land exactly there and nowhere else, the load is
reported with its size, a cancelled load is reported failed and never written,
and a peer with another KV layout fails the loads (the engine recomputes).
The NCCL path is the same code with CUDA tensors: skipped without a GPU.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from baton_worker.attention.kv_cache import KVCache
from baton_worker.kv_connector import KvConnectorWorker, TorchDistributedTransport
from baton_worker.protocol import KvTransfer

BLOCK = 4


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cache(heads: int, device: str = "cpu") -> KVCache:
    config = SimpleNamespace(num_layers=2, num_kv_heads=heads, head_dim=8)
    cache = KVCache(config, num_blocks=16, block_size=BLOCK, dtype=torch.float32, device=torch.device(device))
    return cache


def _fill(cache: KVCache, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for layer in cache.layers:
        layer.copy_(torch.randn(layer.shape, generator=g))


def _transfer(tid: int, peer: int, blocks: list[int], tokens: int) -> KvTransfer:
    return KvTransfer(tid, tid, peer, np.asarray(blocks, np.int32), tokens)


def _prefill(port: int, heads: int, backend: str, device: str, finished) -> None:
    cache = _cache(heads, device)
    _fill(cache, 1)
    worker = KvConnectorWorker(cache, TorchDistributedTransport(f"127.0.0.1:{port}", 2, 0, backend))
    worker.start_sends([_transfer(0, 1, [2, 3], 7), _transfer(1, 1, [9], 4)])
    deadline = time.monotonic() + 30
    while worker.sends and time.monotonic() < deadline:
        worker.poll()
        time.sleep(0.01)
    finished.wait(60)  # the group stays up until the peer has everything
    worker.close()


def _decode(port: int, heads: int, backend: str, device: str, out, finished) -> None:
    cache = _cache(2, device)
    before = [layer.clone() for layer in cache.layers]
    worker = KvConnectorWorker(cache, TorchDistributedTransport(f"127.0.0.1:{port}", 2, 1, backend), load_timeout_s=20)
    worker.start_loads([_transfer(0, 0, [5, 7], 7), _transfer(1, 0, [11], 4)])
    worker.cancel(np.asarray([1], np.int32))
    loaded, failed, errors, nbytes = [], [], [], 0
    deadline = time.monotonic() + 30
    while worker.has_pending_loads and time.monotonic() < deadline:
        report = worker.poll(0.05)
        loaded += report.loaded
        failed += report.failed
        errors += report.errors
        nbytes += report.nbytes
    finished.set()
    worker.close()
    expected = _cache(heads)
    _fill(expected, 1)
    if heads == 2:
        for layer in range(2):
            got, want, was = cache.blocks(layer), expected.blocks(layer), before[layer].view_as(cache.blocks(layer))
            assert torch.equal(got[:, [5, 7]].cpu(), want[:, [2, 3]])
            untouched = [b for b in range(16) if b not in (5, 7)]
            assert torch.equal(got[:, untouched], was[:, untouched])
    out.put((loaded, failed, errors, nbytes))


def _run(heads: int, backend: str = "gloo", device: str = "cpu"):
    ctx = mp.get_context("spawn")
    port = _port()
    out = ctx.Queue()
    finished = ctx.Event()
    procs = [
        ctx.Process(target=_prefill, args=(port, heads, backend, device, finished)),
        ctx.Process(target=_decode, args=(port, heads, backend, device, out, finished)),
    ]
    for p in procs:
        p.start()
    try:
        result = out.get(timeout=120)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert procs[1].exitcode == 0
    return result


def test_blocks_move_between_two_processes_and_a_cancelled_load_is_not_written():
    loaded, failed, errors, nbytes = _run(heads=2)
    assert loaded == [0]
    assert failed == [1] and errors == ["cancelled: its request ended"]
    # 2 layers x (k, v) x 2 heads x 2 blocks x 4 slots x 8 dims x 4 bytes.
    assert nbytes == 2 * 2 * 2 * 2 * BLOCK * 8 * 4


def test_a_peer_with_another_kv_layout_fails_the_loads():
    loaded, failed, errors, _ = _run(heads=4)
    assert loaded == [] and sorted(failed) == [0, 1]
    assert any("KV layout" in e for e in errors)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="NCCL needs two CUDA devices")
def test_nccl_path():
    loaded, _, _, nbytes = _run(heads=2, backend="nccl", device="cuda")
    assert loaded == [0] and nbytes > 0
