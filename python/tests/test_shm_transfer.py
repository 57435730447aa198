"""Tensors between two real worker processes through /dev/shm: same bytes, blocks
freed and reused, a full arena refused by name, nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from baton_worker.transfer.shm import SHM_DIR, ShmArena, ShmFull, ShmReader, ShmRef, remove_segments_of

PYTHON_DIR = Path(__file__).resolve().parents[1]

PRODUCER = r"""
import json, sys, torch
from baton_worker.transfer.shm import ShmArena
arena = ShmArena(1 << 20, tag="test")
g = torch.Generator().manual_seed(7)
refs = []
for dtype, shape in [("float32", (3, 5)), ("bfloat16", (8,)), ("int64", (2, 2, 2)), ("float16", (0, 4)), ("uint8", (1000,))]:
    t = (torch.rand(shape, generator=g) * 100).to(getattr(torch, dtype))
    refs.append(arena.put(t).__dict__ | {"sum": float(t.double().sum())})
print(json.dumps(refs), flush=True)
sys.stdin.readline()  # the consumer has read them
arena.close()
"""


def _ref(d: dict) -> ShmRef:
    return ShmRef(d["segment"], d["offset"], d["nbytes"], d["dtype"], tuple(d["shape"]))


def test_tensors_cross_processes_with_the_same_bytes():
    env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR)}
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        refs = json.loads(producer.stdout.readline())
        reader = ShmReader()
        g = torch.Generator().manual_seed(7)
        for d in refs:
            expected = (torch.rand(tuple(d["shape"]), generator=g) * 100).to(getattr(torch, d["dtype"]))
            got = reader.read(_ref(d))
            assert got.dtype == expected.dtype and got.shape == expected.shape
            assert torch.equal(got, expected)
        segment = refs[0]["segment"]
        assert (SHM_DIR / segment).exists()
        producer.stdin.write("done\n")
        producer.stdin.flush()
        assert producer.wait(timeout=30) == 0
        # The producer unlinked its segment; a reader that still maps it keeps its copy working.
        assert not (SHM_DIR / segment).exists()
        reader.close()
        with pytest.raises(FileNotFoundError, match="is gone"):
            ShmReader().read(_ref(refs[0]))
    finally:
        producer.kill()
        producer.wait()
        remove_segments_of(producer.pid)


def test_blocks_are_freed_coalesced_and_reused():
    arena = ShmArena(4096, tag="reuse")
    try:
        a = arena.put(torch.zeros(256))  # 1024 bytes
        b = arena.put(torch.ones(256))
        c = arena.put(torch.full((256,), 2.0))
        assert arena.live_blocks == 3 and arena.used_bytes == 3072
        arena.free(b)
        arena.free(a)
        arena.free(a)  # a duplicate release is harmless
        d = arena.put(torch.arange(512, dtype=torch.float32))  # 2048 bytes: fits only in the coalesced a+b hole
        assert d.offset == a.offset
        reader = ShmReader()
        assert torch.equal(reader.read(d), torch.arange(512, dtype=torch.float32))
        assert torch.equal(reader.read(c), torch.full((256,), 2.0))
        arena.free(c)
        arena.free(d)
        assert arena.live_blocks == 0 and arena.used_bytes == 0
        # Everything freed: one block the size of the arena fits again.
        whole = arena.put(torch.zeros(1024))
        assert whole.offset == 0
        reader.close()
    finally:
        arena.close()
    assert not (SHM_DIR / arena.name).exists()


def test_a_full_arena_is_refused_by_name_and_the_arena_goes_on():
    arena = ShmArena(1024, tag="full")
    try:
        arena.put(torch.zeros(200))
        with pytest.raises(ShmFull, match=r"has no room for 800 bytes \(832 of 1024 bytes in use\)"):
            arena.put(torch.zeros(200))
        assert arena.live_blocks == 1
        small = arena.put(torch.zeros(10))
        assert small.nbytes == 40
    finally:
        arena.close()


def test_remove_segments_of_cleans_what_a_dead_worker_left():
    script = "from baton_worker.transfer.shm import ShmArena; import os; ShmArena(4096, tag='a'); ShmArena(4096, tag='b'); os._exit(0)"
    env = {**os.environ, "PYTHONPATH": str(PYTHON_DIR)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        assert proc.wait(timeout=60) == 0
        left = sorted(p.name for p in SHM_DIR.glob(f"baton-{proc.pid}-*"))
        assert left == [f"baton-{proc.pid}-a", f"baton-{proc.pid}-b"]
        assert sorted(remove_segments_of(proc.pid)) == left
        assert not list(SHM_DIR.glob(f"baton-{proc.pid}-*"))
    finally:
        proc.kill()
        remove_segments_of(proc.pid)
