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

from .tensor_parallel import GROUP_TIMEOUT

# After Shutdown, how long ranks above 0 get to leave before they are killed.
STOP_GRACE_S = 5.0
# How long the Ray backend waits for its placement group's resources.
PLACEMENT_TIMEOUT_S = 120.0


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


class RayRankGroup:
    """Ranks 1..N-1 as Ray actors placed by a placement group (--distributed-executor-backend ray).

    Rank 0 stays the process the engine spawned; it joins the Ray cluster
    (RAY_ADDRESS, else a local instance ray.init starts) as a driver, reserves
    one bundle per rank (PACK: on as few nodes as fit), and starts each other
    rank as an actor in its bundle, running the same rank loop as a
    subprocess rank would. The store lives at this node's address, so ranks on
    other nodes reach it (and gloo) over TCP. The actors are owned by rank 0's
    driver: Ray kills them when it exits, however it exits."""

    def __init__(self, argv: list[str], size: int, device_type: str = "cpu"):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray = ray
        self.size = size
        self.stopping = False
        # The actors import baton_worker as this process does.
        env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "PYTHONUNBUFFERED": "1"}
        ray.init(namespace="baton", runtime_env={"env_vars": env}, log_to_driver=True)
        resource = {"GPU": 1} if device_type == "cuda" else {"CPU": 1}
        host = ray.util.get_node_ip_address()
        # Bundle 0 stands for rank 0, this process: pinned to this host, as vLLM pins its driver's bundle.
        bundles = [{**resource, f"node:{host}": 0.001}] + [dict(resource) for _ in range(size - 1)]
        self.placement = placement_group(bundles, strategy="PACK")
        ray.get(self.placement.ready(), timeout=PLACEMENT_TIMEOUT_S)
        self.store = dist.TCPStore(host, 0, size, is_master=True, wait_for_workers=False, timeout=GROUP_TIMEOUT)
        address = f"{host}:{self.store.port}"
        actor = ray.remote(RankActor)
        # Bundle 0 stands for rank 0 (this process); rank r runs in bundle r.
        self.actors = [
            actor.options(
                num_cpus=resource.get("CPU", 0),
                num_gpus=resource.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.placement, placement_group_bundle_index=rank),
            ).remote()
            for rank in range(1, size)
        ]
        # Before serve: an actor runs its calls in order, and serve runs until Shutdown.
        self.nodes = ray.get([a.node.remote() for a in self.actors])
        self.loops = [
            a.serve.remote([*argv, "--tp-rank", str(rank), "--tp-store", address])
            for rank, a in enumerate(self.actors, start=1)
        ]
        bundle_nodes = ray.util.placement_group_table(self.placement)["bundles_to_node_id"]
        placed = ", ".join(f"{bundle_nodes[r][:12]}" for r in range(size))
        print(f"baton_worker: tensor-parallel ranks placed by Ray: bundles on nodes {placed}", file=sys.stderr, flush=True)
        threading.Thread(target=self._watch, name="baton-tp-ray", daemon=True).start()

    def _finished(self, timeout: float | None) -> str | None:
        done, _ = self.ray.wait(self.loops, num_returns=1, timeout=timeout)
        if not done:
            return None
        rank = self.loops.index(done[0]) + 1
        try:
            how = f"exited with code {self.ray.get(done[0])}"
        except Exception as error:  # the actor died (killed, its node lost)
            how = f"died ({type(error).__name__})"
        return f"tensor-parallel rank {rank} (Ray actor on node {self.nodes[rank - 1][:12]}) {how}; stopping the rank group"

    def _watch(self) -> None:
        reason = self._finished(None)
        if self.stopping:
            return
        print(f"baton_worker: fatal: {reason}", file=sys.stderr, flush=True)
        self.kill()
        os._exit(1)

    def dead_rank(self, wait_s: float = 1.0) -> str | None:
        return self._finished(wait_s)

    def kill(self) -> None:
        self.stopping = True
        for a in self.actors:
            self.ray.kill(a)

    def stop(self) -> None:
        self.stopping = True
        try:
            self.ray.get(self.loops, timeout=STOP_GRACE_S)
        except Exception:
            self.kill()
        self.ray.util.remove_placement_group(self.placement)
        self.ray.shutdown()


class RankActor:
    """A rank above 0 inside a Ray worker process."""

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def serve(self, argv: list[str]) -> int:
        from ..runtime.options import parse_options
        from ..runtime.server import serve_rank, set_cpu_threads

        opts = parse_options(argv)
        set_cpu_threads(opts)
        return serve_rank(opts)


def _death(rank: int, process: subprocess.Popen) -> str:
    code = process.returncode
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return f"tensor-parallel rank {rank} (pid {process.pid}) {how}; stopping the rank group"
