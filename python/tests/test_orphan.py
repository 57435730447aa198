"""A worker whose parent dies exits on its own (PDEATHSIG / parent polling)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import zmq

from baton_worker import protocol

PYTHON_DIR = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _run_parent(tmp_path: Path, no_pdeathsig: bool) -> int:
    model = tmp_path / "dummy"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 50}))
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    push = context.socket(zmq.PUSH)
    tag = "np" if no_pdeathsig else "pd"
    in_ep, out_ep = f"ipc://{tmp_path}/{tag}-in", f"ipc://{tmp_path}/{tag}-out"
    push.bind(in_ep)
    pull.bind(out_ep)
    # The parent spawns the worker, waits until it is Ready, then dies without cleanup.
    parent = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        env = dict(os.environ, PYTHONPATH={str(PYTHON_DIR)!r})
        if {no_pdeathsig!r}:
            env["BATON_NO_PDEATHSIG"] = "1"
        subprocess.Popen([sys.executable, "-m", "baton_worker", "--model", {str(model)!r}, "--block-size", "16",
                          "--load-format", "dummy-null", "--in-endpoint", {in_ep!r}, "--out-endpoint", {out_ep!r}], env=env)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    try:
        assert pull.poll(60_000), "worker never became ready"
        ready = protocol.decode(pull.recv())
        assert isinstance(ready, protocol.Ready)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while _alive(ready.worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        return ready.worker_pid
    finally:
        proc.kill()
        pull.close(0)
        push.close(0)
        context.term()


def test_worker_exits_when_parent_dies(tmp_path):
    assert not _alive(_run_parent(tmp_path, no_pdeathsig=False))


def test_parent_polling_alone_also_works(tmp_path):
    assert not _alive(_run_parent(tmp_path, no_pdeathsig=True))
