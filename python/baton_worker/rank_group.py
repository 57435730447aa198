"""The processes of a tensor-parallel worker: rank 0 starts ranks 1..N-1 and
the group lives and dies as one.

To the engine the group is one worker: it spawns rank 0, talks to it alone and
kills its process group when it fails. So:
- the other ranks are rank 0's children, in its process group (a SIGKILL of the
  group reaches them), and each protects itself against orphaning (orphan.py:
  it dies when rank 0 does);
- rank 0 watches them: when one exits unasked, rank 0 kills the others and
  exits 1 at once (the engine then restarts the whole group), whether or not
  it was waiting on a collective at the time;
- a rank that hangs blocks rank 0 in the step's collectives, so the step is
  not answered and the engine's step timeout kills the group.

How the Step reaches every rank: rank 0 receives it over ZeroMQ and forwards
its bytes with a torch.distributed broadcast (server.py), as vLLM's
multiprocessing executor forwards from its driver. The engine keeps one
socket pair and one send per step, and collectives keep the ranks in lockstep.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import torch.distributed as dist

from .parallel import GROUP_TIMEOUT

# After Shutdown, how long ranks above 0 get to leave before they are killed.
STOP_GRACE_S = 5.0


class RankGroup:
    """Rank 0's handle on ranks 1..N-1: the store they meet at, and their processes."""

    def __init__(self, argv: list[str], size: int, host: str = "127.0.0.1"):
        self.size = size
        # Port 0: the store picks a free port; the ranks learn it from their command line.
        self.store = dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False, timeout=GROUP_TIMEOUT)
        address = f"{host}:{self.store.port}"
        self.stopping = False
        self.ranks = [
            subprocess.Popen(
                [sys.executable, "-m", "baton_worker", *argv, "--tp-rank", str(rank), "--tp-store", address],
                stdin=subprocess.DEVNULL,
            )
            for rank in range(1, size)
        ]
        for rank, process in enumerate(self.ranks, start=1):
            threading.Thread(target=self._watch, args=(rank, process), name=f"baton-tp-rank-{rank}", daemon=True).start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.ranks]

    def _watch(self, rank: int, process: subprocess.Popen) -> None:
        process.wait()
        if self.stopping:
            return
        print(f"baton_worker: fatal: {_death(rank, process)}", file=sys.stderr, flush=True)
        self.kill()
        os._exit(1)  # the main thread may be blocked in a collective that will never complete

    def dead_rank(self, wait_s: float = 1.0) -> str | None:
        """Why the group failed when a rank exited (a collective on rank 0 then
        fails too, a moment after the exit); None when every rank still runs."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, process in enumerate(self.ranks, start=1):
                if process.poll() is not None:
                    return _death(rank, process)
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def kill(self) -> None:
        self.stopping = True
        for process in self.ranks:
            if process.poll() is None:
                process.kill()

    def stop(self) -> None:
        """After a Shutdown was forwarded: wait for the ranks to leave, kill the ones that do not."""
        self.stopping = True
        for process in self.ranks:
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _death(rank: int, process: subprocess.Popen) -> str:
    code = process.returncode
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return f"tensor-parallel rank {rank} (pid {process.pid}) {how}; stopping the rank group"
