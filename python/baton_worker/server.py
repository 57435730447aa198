"""The worker process: connect to the engine, load, answer Ready, then serve.

Sockets: the engine binds a PUSH at --in-endpoint and a PULL at --out-endpoint;
the worker connects a PULL to the first and a PUSH to the second.
Messages: Step -> StepResult (a Step with mask_rows waits for its StepMask
after the forward pass), Ping -> Pong, Shutdown -> exit 0. Any failure
(start-up or a malformed message) is sent as Fatal with a one-line message,
printed to stderr, and the process exits 1 after giving ZeroMQ ~1 s to flush.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch
import zmq

from . import protocol
from .config import ConfigError
from .loading import load_worker
from .options import OptionsError, out_endpoint_from, parse_options
from .orphan import protect_against_orphaning

LINGER_MS = 1000

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


def serve(channel: Channel, runner, crash_token: int | None = None) -> int:
    while True:
        message = channel.next_message()
        if isinstance(message, protocol.Step):
            if crash_token is not None and any(crash_token in added.token_ids for added in message.added):
                print(f"baton_worker: BATON_TEST_CRASH_TOKEN {crash_token} seen: exiting {CRASH_EXIT_CODE} (test-only)", file=sys.stderr, flush=True)
                os._exit(CRASH_EXIT_CODE)
            channel.send(runner.execute(message, channel.wait_mask))
        elif isinstance(message, protocol.Ping):
            channel.send(protocol.Pong(message.nonce))
        elif isinstance(message, protocol.Shutdown):
            channel.close()
            return 0
        else:
            raise protocol.ProtocolError("message.tag", f"{type(message).__name__} is not sent to the worker")


def set_cpu_threads() -> int:
    """torch's intra-op threads: every core the process may use; OMP_NUM_THREADS, when set, wins.

    Measured end to end on the issue-9 workload (bench compare, 19.7M Llama,
    128 requests at c=32, 2 cores, quiet machine, same session): output tok/s
    819 / 718 (T=0 / T=1) with 1 thread against 1003 / 1055 with 2. Node's
    share of the cores at that load is small, so holding a core back for it
    costs more than it saves. Under heavy outside load (other processes on
    the cores) 1 thread measured faster per step; set OMP_NUM_THREADS=1 there.
    """
    if "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores))
    return torch.get_num_threads()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    protect_against_orphaning()
    set_cpu_threads()
    try:
        opts = parse_options(argv)
    except OptionsError as error:
        out = out_endpoint_from(argv)
        return fail(Channel(None, out) if out else None, one_line(error))
    channel = Channel(opts.in_endpoint, opts.out_endpoint)
    try:
        loaded = load_worker(opts)
    except Exception as error:  # every start-up failure becomes one Fatal line
        if not isinstance(error, (ConfigError, OptionsError)):
            traceback.print_exc()
        return fail(channel, one_line(error))
    channel.send(loaded.ready)
    try:
        return serve(channel, loaded.graph_runner, crash_token_from_env())
    except protocol.ProtocolError as error:
        return fail(channel, one_line(error))
    except Exception as error:
        traceback.print_exc()
        return fail(channel, one_line(error))
    finally:
        loaded.graph_runner.close()  # unlinks the shared-memory arena
