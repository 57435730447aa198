"""The KV connector's worker half: moves KV blocks between a prefill and a decode worker.

Split as vLLM's KVConnectorBase_V1 worker side: the KV cache is registered
once (its layout is the handshake's content), each Step's kv.sends and
kv.loads start asynchronous transfers (start_load_kv / save_kv), and every
StepResult reports the loads that finished since the last one (get_finished).

- A send copies its blocks out of the cache into one staging tensor when its
  step arrives, before that step's forward, so the engine may hand those
  blocks to another request from the next step on whatever the transfer does.
- A load receives into a staging tensor and is written into the cache only
  in poll(), after the step's kv.cancels were applied: a cancelled load (its
  request ended, its blocks may have a new owner) is dropped instead. A load
  reported in a StepResult is thus in the cache before any later step runs.
- A load that fails (the transport says why, or it takes longer than
  load_timeout_s) is reported with its error; the engine then computes that
  request's prompt itself.

The staging layout is [layers, 2 * kv_heads, blocks, block_size * head_dim]
(KVCache.blocks per layer), the same on both sides by the handshake.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..attention.kv_cache import KVCache
from ..protocol import KvTransfer
from .transport import KvTransport, TransferHandle


@dataclass
class LoadReport:
    loaded: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    nbytes: int = 0


@dataclass
class _Load:
    transfer_id: int
    block_ids: torch.Tensor
    staging: torch.Tensor
    handle: TransferHandle
    started: float
    ordinal: int
    cancelled: bool = False


class KvConnectorWorker:
    def __init__(
        self,
        cache: KVCache,
        transport: KvTransport,
        load_timeout_s: float = 30.0,
        fail_load_ordinals: frozenset[int] = frozenset(),
    ):
        self.cache = cache
        self.transport = transport
        self.load_timeout_s = load_timeout_s
        # Test-only (BATON_TEST_KV_LOAD_FAIL): these loads (1-based, in arrival order) fail once their bytes are in.
        self.fail_load_ordinals = fail_load_ordinals
        first = cache.layers[0]
        self.num_layers = len(cache.layers)
        self.block_shape = (2 * cache.num_kv_heads, cache.block_size * cache.head_dim)
        self.dtype = first.dtype
        self.device = first.device
        transport.register(
            {
                "layers": self.num_layers,
                "kv_heads": cache.num_kv_heads,
                "head_dim": cache.head_dim,
                "block_size": cache.block_size,
                "dtype": str(self.dtype),
            }
        )
        self.sends: list[tuple[TransferHandle, torch.Tensor]] = []
        self.loads: dict[int, _Load] = {}
        # Timed-out receives still owning their staging tensor until the transport lets go of it.
        self.abandoned: list[_Load] = []
        self.num_loads = 0

    @property
    def has_pending_loads(self) -> bool:
        return bool(self.loads)

    def start_sends(self, sends: list[KvTransfer]) -> None:
        for s in sends:
            staging = self._gather(s.block_ids)
            self.sends.append((self.transport.send_blocks(s.transfer_id, s.peer_rank, staging), staging))

    def start_loads(self, loads: list[KvTransfer]) -> None:
        for load in loads:
            ids = torch.from_numpy(np.array(load.block_ids, dtype=np.int64)).to(self.device)
            staging = torch.empty((self.num_layers, self.block_shape[0], len(ids), self.block_shape[1]), dtype=self.dtype, device=self.device)
            self.num_loads += 1
            handle = self.transport.recv_blocks(load.transfer_id, load.peer_rank, staging)
            self.loads[load.transfer_id] = _Load(load.transfer_id, ids, staging, handle, time.monotonic(), self.num_loads)

    def cancel(self, transfer_ids) -> None:
        for tid in transfer_ids:
            load = self.loads.get(int(tid))
            if load is not None:
                load.cancelled = True

    def poll(self, wait_s: float = 0.0) -> LoadReport:
        """Finished loads (written into the cache, or failed); waits up to wait_s for a first one."""
        self.sends = [(h, t) for h, t in self.sends if not h.done()]
        self.abandoned = [load for load in self.abandoned if not load.handle.done()]
        report = LoadReport()
        deadline = time.monotonic() + wait_s
        while True:
            now = time.monotonic()
            for tid, load in list(self.loads.items()):
                if load.handle.done():
                    del self.loads[tid]
                    self._finish(load, report)
                elif now - load.started > self.load_timeout_s:
                    del self.loads[tid]
                    self.abandoned.append(load)
                    report.failed.append(tid)
                    report.errors.append(f"the KV load timed out after {self.load_timeout_s:g} s")
            if report.loaded or report.failed or not self.loads or time.monotonic() >= deadline:
                return report
            time.sleep(0.001)

    def close(self) -> None:
        self.transport.close()

    # -- internals --------------------------------------------------------------------

    def _gather(self, block_ids) -> torch.Tensor:
        ids = torch.from_numpy(np.array(block_ids, dtype=np.int64)).to(self.device)
        return torch.stack([self.cache.blocks(layer).index_select(1, ids) for layer in range(self.num_layers)])

    def _finish(self, load: _Load, report: LoadReport) -> None:
        error = load.handle.error()
        if error is None and load.cancelled:
            error = "cancelled: its request ended"
        if error is None and load.ordinal in self.fail_load_ordinals:
            error = f"BATON_TEST_KV_LOAD_FAIL: load {load.ordinal} fails (test-only)"
        if error is not None:
            print(f"baton_worker: KV load {load.transfer_id} failed: {error}", file=sys.stderr, flush=True)
            report.failed.append(load.transfer_id)
            report.errors.append(error)
            return
        for layer in range(self.num_layers):
            self.cache.blocks(layer).index_copy_(1, load.block_ids, load.staging[layer])
        report.loaded.append(load.transfer_id)
        report.nbytes += load.staging.numel() * load.staging.element_size()
