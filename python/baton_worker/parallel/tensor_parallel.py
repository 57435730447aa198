"""Tensor parallelism: the rank group, how each weight is split across it, and
the collectives the forward pass needs.

A worker started with --tensor-parallel-size N is N processes. Rank 0 (the
driver) is the one the engine spawned and talks to over ZeroMQ; it spawns
ranks 1..N-1 itself (server.py), and they join it through a torch.distributed
TCPStore it hosts. Backends: gloo on CPU, NCCL for the model's collectives on
CUDA (step and token broadcasts stay on a gloo group: they are host data).

How the decoder is split (Megatron-style; the same rules vLLM's
ColumnParallelLinear/RowParallelLinear/VocabParallelEmbedding follow):
- q/k/v and gate/up are column-parallel: each rank holds the output rows of its
  attention heads / its slice of the intermediate size, so their outputs need no
  communication;
- o_proj and down_proj are row-parallel: each rank holds the input columns
  matching its heads / intermediate slice, produces a partial sum of the full
  output, and one all-reduce per projection adds them (the bias after it);
- KV heads are split like the q heads when there are at least N of them, and
  replicated (rank r keeps the one its q heads read) when there are fewer;
- the embedding and lm_head are split by vocabulary rows (padded to a multiple
  of N): a token's embedding row lives on one rank (the others contribute
  zeros to an all-reduce); each rank computes the logits of its vocabulary
  slice and rank 0 gathers them for sampling.

At N = 1 there is no group at all (DecoderModel.tp is None): no collective,
no extra copy, the single-process path unchanged.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist

from ..model.config import ConfigError, ModelConfig

# How long a collective of the forward pass (or joining the group) may wait
# for a peer. A rank that hangs is caught sooner by the engine's step timeout,
# which kills the group.
GROUP_TIMEOUT = datetime.timedelta(minutes=10)
# Ranks above 0 wait on the control group for the next Step for as long as the
# server is idle: gloo would fail a wait longer than its group's timeout.
CONTROL_TIMEOUT = datetime.timedelta(days=365)


def check_tensor_parallel(config: ModelConfig, size: int) -> None:
    """ConfigError unless the model can be split into `size` ranks."""
    if size == 1:
        return
    if config.num_heads % size:
        raise ConfigError(
            f"--tensor-parallel-size {size} must divide the model's {config.num_heads} attention heads"
        )
    kv = config.num_kv_heads
    if kv >= size and kv % size:
        raise ConfigError(f"--tensor-parallel-size {size} must divide the model's {kv} key/value heads")
    if kv < size and size % kv:
        raise ConfigError(
            f"the model's {kv} key/value heads are fewer than --tensor-parallel-size {size}, "
            f"which must then be a multiple of them (each key/value head replicated on {size}//{kv} ranks)"
        )
    if config.intermediate_size % size:
        raise ConfigError(
            f"--tensor-parallel-size {size} must divide the model's intermediate_size {config.intermediate_size}"
        )


@dataclass(frozen=True)
class Partition:
    """Which rows/columns of each full weight one rank holds."""

    rank: int
    size: int
    q_heads: tuple[int, int]  # [first, end) of the attention heads
    kv_heads: tuple[int, int]  # [first, end) of the key/value heads (one replicated head when fewer than ranks)
    intermediate: tuple[int, int]  # [first, end) of the MLP's intermediate features
    vocab: tuple[int, int]  # [first, end) of the vocabulary rows (end may pass vocab_size: padding)

    @staticmethod
    def of(config: ModelConfig, rank: int, size: int) -> Partition:
        check_tensor_parallel(config, size)
        heads = config.num_heads // size
        kv = config.num_kv_heads
        if kv >= size:
            per = kv // size
            kv_heads = (rank * per, (rank + 1) * per)
        else:
            first = rank * kv // size
            kv_heads = (first, first + 1)
        inter = config.intermediate_size // size
        shard = -(-config.vocab_size // size)
        return Partition(
            rank, size, (rank * heads, (rank + 1) * heads), kv_heads, (rank * inter, (rank + 1) * inter),
            (rank * shard, (rank + 1) * shard),
        )

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The config as this rank's attention and KV cache see it: its own head counts."""
        return replace(
            config,
            num_heads=self.q_heads[1] - self.q_heads[0],
            num_kv_heads=self.kv_heads[1] - self.kv_heads[0],
            intermediate_size=self.intermediate[1] - self.intermediate[0],
        )

    # ---- slicing full HF tensors (weights are [out_features, in_features]) ----

    def qkv_rows(self, which: str, tensor: torch.Tensor, head_dim: int) -> torch.Tensor:
        """Column-parallel q, k or v (weight or bias): this rank's heads' output rows."""
        first, end = self.q_heads if which == "q" else self.kv_heads
        return tensor[first * head_dim : end * head_dim].contiguous()

    def intermediate_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """Column-parallel gate or up (weight or bias)."""
        return tensor[self.intermediate[0] : self.intermediate[1]].contiguous()

    def o_columns(self, weight: torch.Tensor, head_dim: int) -> torch.Tensor:
        """Row-parallel o_proj: the input columns of this rank's heads."""
        return weight[:, self.q_heads[0] * head_dim : self.q_heads[1] * head_dim].contiguous()

    def down_columns(self, weight: torch.Tensor) -> torch.Tensor:
        """Row-parallel down_proj: the input columns of this rank's intermediate slice."""
        return weight[:, self.intermediate[0] : self.intermediate[1]].contiguous()

    def vocab_rows(self, weight: torch.Tensor) -> torch.Tensor:
        """Embedding or lm_head rows of this rank's vocabulary slice, zero-padded to the shard size."""
        first, end = self.vocab
        rows = weight[first:end]
        missing = (end - first) - rows.shape[0]
        if missing:
            rows = torch.cat([rows, rows.new_zeros(missing, weight.shape[1])])
        return rows.contiguous()


class TensorParallelGroup:
    """This process's place in the rank group and the collectives it runs.

    Every rank runs the same forward on the same Step; only rank 0 samples and
    answers. Collectives are issued in the same order on every rank because
    every rank executes the same code on the same Step."""

    def __init__(self, rank: int, size: int, store: dist.Store, device: torch.device):
        self.rank = rank
        self.size = size
        self.device = device
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=GROUP_TIMEOUT)
        # Host data (the Step's bytes, sampled ids) travels on its own gloo
        # group whatever the model's backend (NCCL only moves device tensors),
        # with a timeout an idle server never reaches.
        self.control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)

    @property
    def is_driver(self) -> bool:
        return self.rank == 0

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # ---- the forward pass ----

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of every rank's partial x (in place)."""
        dist.all_reduce(x)
        return x

    def embed(self, input_ids: torch.Tensor, shard: torch.Tensor, partition: Partition) -> torch.Tensor:
        """Vocabulary-parallel embedding lookup: each token's row comes from the
        rank holding it, zeros from the others, summed (exact: one term is non-zero)."""
        first, end = partition.vocab
        outside = (input_ids < first) | (input_ids >= end)
        local = torch.where(outside, torch.zeros_like(input_ids), input_ids - first)
        rows = torch.nn.functional.embedding(local, shard)
        rows.masked_fill_(outside.unsqueeze(-1), 0)
        return self.all_reduce(rows)

    def gather_logits(self, local: torch.Tensor, vocab_size: int) -> torch.Tensor | None:
        """Rank 0: the full [rows, vocab_size] logits from every rank's vocabulary
        slice (padding dropped); other ranks: None."""
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.size)] if self.is_driver else None
        dist.gather(local, parts, dst=0)
        if parts is None:
            return None
        return torch.cat(parts, dim=-1)[:, :vocab_size]

    # ---- the control plane's data ----

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        """Rank 0's payload on every rank (others pass None)."""
        length = torch.tensor([len(payload) if payload is not None else 0], dtype=torch.int64)
        dist.broadcast(length, 0, group=self.control)
        buffer = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            if payload is not None
            else torch.empty(int(length.item()), dtype=torch.uint8)
        )
        if len(buffer):
            dist.broadcast(buffer, 0, group=self.control)
        return payload if payload is not None else buffer.numpy().tobytes()

    def broadcast_tokens(self, tokens: np.ndarray | None, count: int) -> np.ndarray:
        """The ids rank 0 sampled, on every rank: the other ranks append them to
        their own copy of the batch, so the next step's inputs agree."""
        if count == 0:
            return np.zeros(0, np.int32)
        buffer = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int32)) if tokens is not None else torch.empty(count, dtype=torch.int32)
        dist.broadcast(buffer, 0, group=self.control)
        return buffer.numpy()


def rank_threads(size: int) -> int:
    """Intra-op threads per rank: the process's cores shared among the ranks of this host."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // size)
