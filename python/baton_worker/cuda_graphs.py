"""CUDA graphs for decode-only steps (CUDA with the flex backend only).

One graph per batch-size bucket, captured at load time from the largest down
(sharing one memory pool); a decode step of R rows replays the smallest
bucket >= R with its inputs padded by repeating the last row. Steps with any
prefill chunk, or more rows than the largest bucket, run eagerly.

NOT RUN ON A GPU YET: no GPU was lent while this was written. Loading falls
back to eager steps (with a message on stderr) if capture fails.
"""

from __future__ import annotations

import torch

from .attention import FlexBackend
from .model import DecoderModel
from .persistent_batch import StepInputs

BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


class DecodeGraphs:
    def __init__(self, model: DecoderModel, attention: FlexBackend, max_pages: int):
        self.model, self.attention = model, attention
        device = attention.device
        largest = BATCH_SIZES[-1]
        self.input_ids = torch.zeros(largest, dtype=torch.int64, device=device)
        self.positions = torch.zeros(largest, dtype=torch.int64, device=device)
        self.rows = torch.arange(largest, device=device)
        attention.static_decode(largest, max_pages)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        pool = None
        for size in reversed(BATCH_SIZES):
            attention.use_static(size)
            args = (self.input_ids[:size], self.positions[:size], self.rows[:size], attention)
            model.forward(*args)  # warm-up: compiles flex for this shape outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = model.forward(*args)
            pool = graph.pool()
            self.graphs[size] = graph

    def run(self, inputs: StepInputs) -> torch.Tensor | None:
        """Logits of a decode-only step from a graph replay, or None when the step does not qualify."""
        meta = inputs.attention
        rows = meta.num_rows
        if rows == 0 or rows > BATCH_SIZES[-1] or len(inputs.input_ids_host) != rows:
            return None
        size = next(s for s in BATCH_SIZES if s >= rows)
        pad = self.attention.fill_static(meta, size)
        self.input_ids[:size].copy_(inputs.input_ids[pad])
        self.positions[:size].copy_(inputs.positions[pad])
        self.graphs[size].replay()
        # Every row of a decode-only step is one token, so row i's logits are row i.
        return self.logits[size].index_select(0, inputs.logits_indices)
