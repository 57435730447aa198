"""The KV connector's transfer interface and its torch.distributed implementation.

A transport moves one contiguous tensor of KV blocks between two workers under
a tag (the engine's transfer id). It is what NIXL or Mooncake would implement
(they read the registered cache directly; this one sends a staging copy):

- register(layout): this worker's KV layout, exchanged in the handshake so a
  peer with another layout is refused (every transfer with it fails, and the
  engine recomputes instead);
- send_blocks / recv_blocks: start an asynchronous transfer, return a handle;
- handle.done() / handle.error(): poll it.

TorchDistributedTransport joins a torch.distributed process group of the
deployment's workers (gloo on CPU, NCCL for CUDA tensors) through a TCPStore
that rank 0 serves, lazily: the first transfer starts the rendezvous in a
background thread (the ranks of a deployment start one after another, so
none may block at start-up), and transfers queue until it is done. Its own
group, not the default one, so tensor parallel's group is left alone.
"""

from __future__ import annotations

import json
import queue
import threading
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist


class TransferHandle(Protocol):
    def done(self) -> bool: ...

    def error(self) -> str | None: ...


class KvTransport(Protocol):
    def register(self, layout: dict[str, Any]) -> None: ...

    def send_blocks(self, tag: int, peer: int, blocks: torch.Tensor) -> TransferHandle: ...

    def recv_blocks(self, tag: int, peer: int, blocks: torch.Tensor) -> TransferHandle: ...

    def close(self) -> None: ...


class _Handle:
    """A transfer: queued until the group is up, then posted as a torch.distributed Work and waited for."""

    def __init__(self, send: bool, tag: int, peer: int, tensor: torch.Tensor):
        self.send = send
        self.tag = tag
        self.peer = peer
        self.tensor = tensor
        self.work: Any = None
        self.failure: str | None = None
        self.finished = threading.Event()

    def done(self) -> bool:
        return self.finished.is_set()

    def error(self) -> str | None:
        return self.failure if self.finished.is_set() else None

    def fail(self, message: str) -> None:
        self.failure = message
        self.finished.set()


class TorchDistributedTransport:
    """Point-to-point over a torch.distributed group of `world_size` workers (see the module docstring).

    Two daemon threads: one joins the group and then posts each transfer as it
    comes (send/recv return at once), one waits for the posted transfers in
    order (gloo completes a Work only through wait()) and marks them done.
    """

    def __init__(self, address: str, world_size: int, rank: int, backend: str = "gloo", timeout_s: float = 60.0):
        host, _, port = address.rpartition(":")
        self.host = host or "127.0.0.1"
        self.port = int(port)
        self.world_size = world_size
        self.rank = rank
        self.backend = backend
        self.timeout = timedelta(seconds=timeout_s)
        self.layout: dict[str, Any] = {}
        self._group: Any = None
        self._store: Any = None
        self._peer_layouts: dict[int, dict[str, Any]] = {}
        self._started = False
        self._lock = threading.Lock()
        self._to_post: queue.SimpleQueue[_Handle | None] = queue.SimpleQueue()
        self._to_wait: queue.SimpleQueue[_Handle | None] = queue.SimpleQueue()

    def register(self, layout: dict[str, Any]) -> None:
        self.layout = layout

    def send_blocks(self, tag: int, peer: int, blocks: torch.Tensor) -> TransferHandle:
        return self._start(_Handle(True, tag, peer, blocks))

    def recv_blocks(self, tag: int, peer: int, blocks: torch.Tensor) -> TransferHandle:
        return self._start(_Handle(False, tag, peer, blocks))

    def close(self) -> None:
        """Stops posting. The group itself goes with the process: shutting it down
        while the peer still holds its end aborts the process in gloo."""
        self._to_post.put(None)

    # -- internals --------------------------------------------------------------------

    def _start(self, handle: _Handle) -> _Handle:
        with self._lock:
            if not self._started:
                self._started = True
                threading.Thread(target=self._post_loop, name="kv-transfer-post", daemon=True).start()
                threading.Thread(target=self._wait_loop, name="kv-transfer-wait", daemon=True).start()
        self._to_post.put(handle)
        return handle

    def _post_loop(self) -> None:
        failure = self._rendezvous()
        while (handle := self._to_post.get()) is not None:
            reason = failure or self._mismatch(handle.peer)
            if reason is not None:
                handle.fail(reason)
                continue
            try:
                op = self._group.send if handle.send else self._group.recv
                handle.work = op([handle.tensor], handle.peer, handle.tag)
            except Exception as e:  # noqa: BLE001 - a transport error fails this transfer only
                handle.fail(_one_line(e))
                continue
            self._to_wait.put(handle)
        self._to_wait.put(None)

    def _wait_loop(self) -> None:
        while (handle := self._to_wait.get()) is not None:
            try:
                handle.work.wait()
            except Exception as e:  # noqa: BLE001
                handle.failure = _one_line(e)
            handle.finished.set()

    def _rendezvous(self) -> str | None:
        """Joins the group and publishes this worker's KV layout (the handshake); the error line if it cannot."""
        try:
            store = dist.TCPStore(self.host, self.port, self.world_size, self.rank == 0, self.timeout, wait_for_workers=False)
            self._store = dist.PrefixStore("baton-kv", store)
            if self.backend == "nccl":
                group = dist.ProcessGroupNCCL(self._store, self.rank, self.world_size)
            else:
                group = dist.ProcessGroupGloo(self._store, self.rank, self.world_size, self.timeout)
            self._store.set(f"layout/{self.rank}", json.dumps(self.layout))
            self._group = group
            return None
        except Exception as e:  # noqa: BLE001 - every transfer fails with this line (the engine recomputes)
            return f"KV transfer rendezvous at {self.host}:{self.port} failed: {_one_line(e)}"

    def _mismatch(self, peer: int) -> str | None:
        if peer not in self._peer_layouts:
            try:
                self._peer_layouts[peer] = json.loads(self._store.get(f"layout/{peer}"))
            except Exception as e:  # noqa: BLE001
                return f"no KV layout from rank {peer}: {_one_line(e)}"
        theirs = self._peer_layouts[peer]
        if theirs != self.layout:
            return f"rank {peer}'s KV layout {theirs} differs from this worker's {self.layout}"
        return None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]
