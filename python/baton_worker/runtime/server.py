"""The worker process: connect to the engine, load, answer Ready, then serve.

Sockets: the engine binds a PUSH at --in-endpoint and a PULL at --out-endpoint;
the worker connects a PULL to the first and a PUSH to the second.
Messages: Step -> StepResult (a Step with mask_rows waits for its StepMask
after the forward pass), Ping -> Pong, Shutdown -> exit 0. Any failure
(start-up or a malformed message) is sent as Fatal with a one-line message,
printed to stderr, and the process exits 1 after giving ZeroMQ ~1 s to flush.

Tensor parallel (--tensor-parallel-size N > 1): this process is rank 0 and the
only one with sockets; it starts the other ranks (rank_group.py) and forwards
each Step and the Shutdown to them with a torch.distributed broadcast before
running it. Ranks above 0 (serve_rank) loop on those broadcasts, run the same
forward, and never answer: rank 0 samples and sends the StepResult.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
import zmq

from .. import protocol
from ..model.config import ConfigError
from ..parallel.rank_group import RankGroup, RayRankGroup
from ..parallel.tensor_parallel import GROUP_TIMEOUT, TensorParallelGroup, rank_threads
from .loading import check_tensor_parallel_model, load_worker, resolve_device
from .options import OptionsError, WorkerOptions, out_endpoint_from, parse_options
from .orphan import protect_against_orphaning

LINGER_MS = 1000
# How often a worker with a launched step looks for the next message and for its tokens.
POLL_S = 50e-6

# Test-only: with BATON_TEST_CRASH_TOKEN=<id> set, a step that adds a request
# whose tokens contain that id makes the worker exit at once (code 86, no
# Fatal), as a request that crashes the worker would. Off unless the variable
# is set; the reliability tests use it for "a request that kills the worker
# every time it runs".
CRASH_EXIT_CODE = 86


def crash_token_from_env() -> int | None:
    value = os.environ.get("BATON_TEST_CRASH_TOKEN")
    return int(value) if value else None


class Channel:
    """The worker's two sockets."""

    def __init__(self, in_endpoint: str | None, out_endpoint: str):
        self.context = zmq.Context()
        self.push = self.context.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, LINGER_MS)
        self.push.connect(out_endpoint)
        self.pull = None
        self.backlog: list = []
        if in_endpoint is not None:
            self.pull = self.context.socket(zmq.PULL)
            self.pull.setsockopt(zmq.LINGER, 0)
            self.pull.connect(in_endpoint)

    def send(self, message) -> None:
        self.push.send(protocol.encode(message), copy=False)

    def recv(self) -> bytes:
        return self.pull.recv(copy=True)

    def next_message(self):
        """The next message: one put aside while waiting for a step mask, else from the socket."""
        if self.backlog:
            return self.backlog.pop(0)
        return protocol.decode(self.recv())

    def next_message_or(self, ready: Callable[[], bool]):
        """The next message, or None as soon as ready() holds with no message waiting."""
        while True:
            if self.backlog:
                return self.backlog.pop(0)
            if self.pull.poll(0):
                return protocol.decode(self.recv())
            if ready():
                return None
            time.sleep(POLL_S)

    def wait_mask(self, step_id: int):
        """Waits for the StepMask of step_id (sent once the engine knows the tokens
        before the step's constrained rows). Pings are answered meanwhile; a next
        Step (overlap) or Shutdown is kept for the main loop."""
        while True:
            message = protocol.decode(self.recv())
            if isinstance(message, protocol.StepMask):
                if message.step_id != step_id:
                    raise protocol.ProtocolError("StepMask.step_id", f"got the mask of step {message.step_id} while step {step_id} waits")
                return message
            if isinstance(message, protocol.Ping):
                self.send(protocol.Pong(message.nonce))
            else:
                self.backlog.append(message)

    def close(self) -> None:
        if self.pull is not None:
            self.pull.close()
        self.push.close()  # waits up to LINGER_MS for queued messages
        self.context.term()


def one_line(error: BaseException) -> str:
    if isinstance(error, (ConfigError, OptionsError, protocol.ProtocolError)):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}"
    return " ".join(text.split())


def fail(channel: Channel | None, message: str) -> int:
    print(f"baton_worker: fatal: {message}", file=sys.stderr, flush=True)
    if channel is not None:
        try:
            channel.send(protocol.Fatal(message))
        finally:
            channel.close()
    return 1


def serve(channel: Channel, runner, crash_token: int | None = None, tp: TensorParallelGroup | None = None) -> int:
    """tp: rank 0's group, to which every Step and the Shutdown are forwarded (None: no other ranks).

    Overlap: a Step the runner can overlap is launched before the previous
    step's result is sent (the engine sends step N+1 before it has N's result),
    so the device runs N+1's forward pass right after N's while the host reads
    N's tokens and sends them. With nothing to launch, a launched step is
    finished as soon as its tokens are on the host."""
    pending = None  # a launched step whose result is not sent yet
    while True:
        message = channel.next_message() if pending is None else channel.next_message_or(pending.done)
        if message is None:
            channel.send(pending.finish())
            pending = None
        elif isinstance(message, protocol.Step):
            if crash_token is not None and any(crash_token in added.token_ids for added in message.added):
                print(f"baton_worker: BATON_TEST_CRASH_TOKEN {crash_token} seen: exiting {CRASH_EXIT_CODE} (test-only)", file=sys.stderr, flush=True)
                os._exit(CRASH_EXIT_CODE)
            if tp is not None:
                tp.broadcast_bytes(protocol.encode(message))
            overlaps = runner.overlaps(message)
            if pending is not None and not overlaps:
                channel.send(pending.finish())
                pending = None
            launched = runner.launch(message, channel.wait_mask, overlaps)
            if pending is not None:
                channel.send(pending.finish())
            pending = launched
        elif isinstance(message, protocol.Ping):
            channel.send(protocol.Pong(message.nonce))
        elif isinstance(message, protocol.Shutdown):
            if pending is not None:
                channel.send(pending.finish())
            if tp is not None:
                tp.broadcast_bytes(protocol.encode(message))
            channel.close()
            return 0
        else:
            raise protocol.ProtocolError("message.tag", f"{type(message).__name__} is not sent to the worker")


def set_cpu_threads(opts: WorkerOptions | None = None) -> int:
    """torch's intra-op threads: the process's share of the cores it may use
    (shared by --host-workers worker processes, each with its tensor-parallel
    ranks; None: a lone worker); OMP_NUM_THREADS, when set, wins.
    Oversubscribed cores cost far more than idle ones: two data-parallel
    replicas with 2 threads each on 2 cores measured 550-580 output tok/s on
    the workload below, against 1536-1555 with 1 thread each.

    Measured end to end on the side-by-side workload of bench compare (19.7M
    Llama, 128 requests at c=32, 2 cores, quiet machine, same session): output
    tok/s 819 / 718 (T=0 / T=1) with 1 thread against 1003 / 1055 with 2. Node's
    share of the cores at that load is small, so holding a core back for it
    costs more than it saves. Under heavy outside load (other processes on
    the cores) 1 thread measured faster per step; set OMP_NUM_THREADS=1 there.
    """
    if "OMP_NUM_THREADS" not in os.environ:
        # Tensor-parallel ranks on one host share its cores.
        torch.set_num_threads(rank_threads(1 if opts is None else opts.tensor_parallel_size * opts.host_workers))
    return torch.get_num_threads()


def _tp_device(opts: WorkerOptions, rank: int) -> torch.device:
    """The rank's device: on CUDA, GPU number `rank` of this host."""
    if opts.device != "cpu" and torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())  # a Ray actor sees only its own GPU
    return resolve_device(opts.device)


def serve_rank(opts: WorkerOptions) -> int:
    """A tensor-parallel rank above 0: join rank 0's group, load this rank's
    shard, then run every Step rank 0 forwards until it forwards Shutdown.
    Failures go to stderr only (rank 0 notices the exit and stops the group)."""
    tp = None
    try:
        host, port = opts.tp_store.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), opts.tensor_parallel_size, is_master=False, timeout=GROUP_TIMEOUT)
        tp = TensorParallelGroup(opts.tp_rank, opts.tensor_parallel_size, store, _tp_device(opts, opts.tp_rank))
        loaded = load_worker(opts, tp=tp)
        while True:
            message = protocol.decode(tp.broadcast_bytes(None))
            if isinstance(message, protocol.Step):
                loaded.graph_runner.execute(message)
            elif isinstance(message, protocol.Shutdown):
                return 0
    except Exception as error:
        if not isinstance(error, ConfigError):
            traceback.print_exc()
        print(f"baton_worker: fatal: tensor-parallel rank {opts.tp_rank}: {one_line(error)}", file=sys.stderr, flush=True)
        return 1
    finally:
        if tp is not None:
            tp.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    protect_against_orphaning()
    try:
        opts = parse_options(argv)
    except OptionsError as error:
        out = out_endpoint_from(argv)
        return fail(Channel(None, out) if out else None, one_line(error))
    set_cpu_threads(opts)
    if opts.tp_rank > 0:
        return serve_rank(opts)
    channel = Channel(opts.in_endpoint, opts.out_endpoint)
    ranks, tp = None, None
    try:
        if opts.tensor_parallel_size > 1:
            check_tensor_parallel_model(opts)  # a clear Fatal before any rank starts
            device = _tp_device(opts, 0)
            if opts.distributed_executor_backend == "ray":
                ranks = RayRankGroup(argv, opts.tensor_parallel_size, device.type)
            else:
                ranks = RankGroup(argv, opts.tensor_parallel_size)
            tp = TensorParallelGroup(0, opts.tensor_parallel_size, ranks.store, device)
        loaded = load_worker(opts, tp=tp)
    except Exception as error:  # every start-up failure becomes one Fatal line
        if ranks is not None:
            ranks.kill()
        if not isinstance(error, (ConfigError, OptionsError)):
            traceback.print_exc()
        return fail(channel, one_line(error))
    channel.send(loaded.ready)
    try:
        code = serve(channel, loaded.graph_runner, crash_token_from_env(), tp)
        if ranks is not None:
            ranks.stop()  # they got the Shutdown: let them leave
        return code
    except protocol.ProtocolError as error:
        if ranks is not None:
            ranks.kill()
        return fail(channel, one_line(error))
    except Exception as error:
        # A collective fails when a peer rank died: name the rank, not the socket error.
        dead = ranks.dead_rank() if ranks is not None else None
        if ranks is not None:
            ranks.kill()
        if dead is None:
            traceback.print_exc()
        return fail(channel, dead or one_line(error))
    finally:
        loaded.graph_runner.close()  # unlinks the shared-memory arena
