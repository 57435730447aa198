"""CUDA graphs for decode-only steps (the Triton attention backend on CUDA).

One graph per batch-size bucket, captured at load time from the largest down
(sharing one memory pool); a decode step of R rows replays the smallest
bucket >= R with its inputs padded by repeating the last row (same slot, same
K/V: writing it twice is harmless). Steps with any prefill chunk, prompt
embeddings or prompt logprobs, or more rows than the largest bucket, run
eagerly.

A speculative verify step (each row one known token and its drafts) replays the
same graphs with every token as a row of its own: token j of a row attends to
the row's context up to itself (its seq_len), over the row's block table. All
K/V of the step is written before any layer's attention reads it, so a draft
sees the drafts before it, as a causal chunk would; the context is read once
per token instead of once per row, which costs little where decode is bound by
the weights' bytes.

A captured graph replays raw device addresses, so ownership is the rule here:
DecodeGraphs owns the static inputs (sized for the largest bucket), and each
DecodeGraph owns its attention plan (views of those inputs) and its logits,
and holds the static inputs too. Nothing a replay reads is reachable only
through an attribute that a later step or a later capture replaces; the
backend itself keeps no per-step state.

Without capture (on CPU) the same static path runs eagerly, which is how the
tests check it against the normal path.
"""

from __future__ import annotations

from dataclasses import dataclass

import dataclasses

import numpy as np
import torch

from ..attention import AttentionMetadata
from ..attention.triton_attention import TritonBackend, TritonPlan
from ..model.decoder import DecoderModel
from .persistent_batch import StepInputs

BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass
class StaticInputs:
    """What every decode graph reads, sized for the largest bucket."""

    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    slots: torch.Tensor  # [N] int64: cache slot of each row's new token
    seq_lens: torch.Tensor  # [N] int32
    table: torch.Tensor  # [N, max pages] int64 block ids
    rows: torch.Tensor  # [N] arange: each row's token, and the logits rows

    @staticmethod
    def allocate(rows: int, max_pages: int, device: torch.device) -> StaticInputs:
        z = lambda *shape, dtype=torch.int64: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        return StaticInputs(z(rows), z(rows), z(rows), z(rows, dtype=torch.int32), z(rows, max_pages), torch.arange(rows, device=device))

    def fill(self, inputs: StepInputs, size: int) -> None:
        """Copies a decode step of R <= size rows in, padding to `size` rows by repeating the last."""
        meta = inputs.attention
        rows = meta.num_rows
        pad = None if rows == size else self.rows[:size].clamp(max=rows - 1)
        padded = (lambda t: t) if pad is None else (lambda t: t.index_select(0, pad))  # noqa: E731
        self.input_ids[:size].copy_(padded(inputs.input_ids))
        self.positions[:size].copy_(padded(inputs.positions))
        self.slots[:size].copy_(padded(meta.slot_mapping))
        table = padded(meta.block_table)
        self.table[:size, : table.shape[1]].copy_(table)
        lens = meta.seq_lens if pad is None else meta.seq_lens[np.minimum(np.arange(size), rows - 1)]
        self.seq_lens[:size].copy_(torch.from_numpy(lens.astype(np.int32)), non_blocking=True)


@dataclass
class DecodeGraph:
    """One bucket: its graph (None when not captured) and everything its replay reads and writes."""

    size: int
    static: StaticInputs
    plan: TritonPlan
    graph: torch.cuda.CUDAGraph | None
    logits: torch.Tensor | None

    def args(self) -> tuple:
        st = self.static
        return st.input_ids[: self.size], st.positions[: self.size], st.rows[: self.size], self.plan

    def run(self, model: DecoderModel) -> torch.Tensor:
        if self.graph is None:
            self.logits = model.forward(*self.args())
        else:
            self.graph.replay()
        return self.logits


class DecodeGraphs:
    def __init__(self, model: DecoderModel, attention: TritonBackend, max_pages: int, max_rows: int = BATCH_SIZES[-1],
                 capture: bool = True):
        self.model = model
        sizes = [s for s in BATCH_SIZES if s < max_rows] + [max_rows]
        device = attention.device
        self.static = StaticInputs.allocate(sizes[-1], max_pages, device)
        st = self.static
        self.graphs: dict[int, DecodeGraph] = {}
        pool = None
        for size in reversed(sizes):
            plan = attention.decode_plan(st.slots[:size], st.rows[:size], st.seq_lens[:size], st.table[:size])
            entry = DecodeGraph(size, st, plan, None, None)
            if capture:
                st.seq_lens.fill_(1)  # a real context for the warm-up (slot 0 of the zeroed cache; nothing reads it yet)
                model.forward(*entry.args())  # warm-up: compiles the kernels outside the capture
                torch.cuda.synchronize(device)
                entry.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(entry.graph, pool=pool):
                    entry.logits = model.forward(*entry.args())
                pool = entry.graph.pool()
            self.graphs[size] = entry
        self.sizes = sizes

    def run(self, inputs: StepInputs) -> torch.Tensor | None:
        """Logits of a decode-only step from its bucket, or None when the step does not qualify."""
        rows = inputs.attention.num_rows
        if rows == 0 or rows > self.sizes[-1] or len(inputs.input_ids_host) != rows:
            return None
        size = next(s for s in self.sizes if s >= rows)
        self.static.fill(inputs, size)
        logits = self.graphs[size].run(self.model)
        # Every row of a decode-only step is one token, so row i's logits are row i.
        return logits.index_select(0, inputs.logits_indices)

    def verify(self, inputs: StepInputs) -> torch.Tensor | None:
        """Logits of every token [T, vocab] of a step whose rows are each one known
        token and its drafts (the caller checks that), every token replayed as a
        decode row; None when the tokens outnumber the largest bucket."""
        meta = inputs.attention
        t = len(inputs.input_ids_host)
        if t == 0 or t > self.sizes[-1]:
            return None
        q_lens = meta.q_lens
        row = np.repeat(np.arange(meta.num_rows), q_lens)
        local = np.arange(t) - np.repeat(meta.query_start[:-1], q_lens)
        seq_lens = np.repeat(meta.seq_lens - q_lens, q_lens) + local + 1
        table = meta.block_table.index_select(0, torch.from_numpy(row).to(meta.block_table.device, non_blocking=True))
        per_token = dataclasses.replace(inputs, attention=AttentionMetadata(meta.slot_mapping, np.arange(t + 1), seq_lens, table,
                                                                            meta.block_size))
        size = next(s for s in self.sizes if s >= t)
        self.static.fill(per_token, size)
        return self.graphs[size].run(self.model)[:t]
