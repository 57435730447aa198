"""One step's LoRA work, as the decoder's projections apply it.

Built once per step from the adapter of each packed token (0: the base
model): the adapter tokens sorted by adapter, cut into segments, one per
distinct adapter. Every projection then calls add_(y, x, layer, group):
y += the delta of each segment's adapter over that segment's tokens, each
module of a fused group (q/k/v, gate/up) into its own slice of y.

- torch (CPU): one matrix multiply pair per distinct adapter, over its
  tokens as a contiguous slice when they are one, else gathered with
  index_select and added back with index_add_; a fused group multiplies
  the adapter's stacked A and block-diagonal B (adapter.grouped()).
- kernels (CUDA): the Punica-style shrink and expand of kernels.py over the
  slot stacks (manager.LoraSlots), one launch each per projection group.

Base-model tokens are in no segment, so they cost nothing; a group none of
the step's adapters touches at a layer is skipped. A step whose rows are
all base-model rows has no LoraBatch at all (the decoder's plain path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from .adapter import LoraAdapter, LoraLayout

if TYPE_CHECKING:
    from .manager import LoraSlots


class LoraBatch:
    def __init__(
        self,
        present: np.ndarray,
        segments: list[tuple[list, slice | torch.Tensor]] | None = None,
        slots: LoraSlots | None = None,
        order: torch.Tensor | None = None,
        tiles: torch.Tensor | None = None,
    ):
        """present: bool [layers, groups], some adapter of the step has weights there.
        torch path: segments, (the adapter's grouped weights, its tokens) each.
        kernel path: slots (the stacked weights), order (adapter tokens sorted by adapter,
        int64) and tiles (int32 [n, 3]: first entry of order, its segment's end, slot)."""
        self.present = present
        self.segments = segments
        self.slots = slots
        self.order = order
        self.tiles = tiles

    @staticmethod
    def build(
        token_lora: np.ndarray, adapters: dict[int, LoraAdapter], layout: LoraLayout, device: torch.device,
        slots: LoraSlots | None = None,
    ) -> LoraBatch | None:
        """token_lora: the adapter id of each packed token of the step (0: base model); every
        nonzero id is in `adapters`. slots: the kernel path's stacks (None: the torch path).
        None when no token has an adapter."""
        tokens = np.flatnonzero(token_lora)
        if not len(tokens):
            return None
        ids = token_lora[tokens]
        by_adapter = np.argsort(ids, kind="stable")
        order = tokens[by_adapter]
        lora_ids, starts, counts = np.unique(ids[by_adapter], return_index=True, return_counts=True)
        step_adapters = [adapters[int(i)] for i in lora_ids]
        present = np.logical_or.reduce([a.present for a in step_adapters])
        if slots is not None:
            from .kernels import BLOCK_M

            slot_ids = slots.place(step_adapters)
            per_segment = -(-counts // BLOCK_M)
            segment = np.repeat(np.arange(len(lora_ids)), per_segment)
            within = np.arange(int(per_segment.sum())) - np.repeat(np.cumsum(per_segment) - per_segment, per_segment)
            tiles = np.stack((starts[segment] + within * BLOCK_M, (starts + counts)[segment], slot_ids[segment]), axis=1)
            return LoraBatch(
                present,
                slots=slots,
                order=torch.from_numpy(order.astype(np.int64)).to(device),
                tiles=torch.from_numpy(tiles.astype(np.int32)).to(device),
            )
        segments = []
        for adapter, start, count in zip(step_adapters, starts.tolist(), counts.tolist()):
            rows = order[start : start + count]
            if rows[-1] - rows[0] == count - 1:  # one run of tokens (a prefill chunk, neighbouring rows): a view
                where: slice | torch.Tensor = slice(int(rows[0]), int(rows[-1]) + 1)
            else:
                where = torch.from_numpy(rows.astype(np.int64)).to(device)
            segments.append((adapter.grouped(layout), where))
        return LoraBatch(present, segments=segments)

    def add_(self, y: torch.Tensor, x: torch.Tensor, layer: int, group: int) -> None:
        """In place: y [tokens, group's out] += the step's adapters' deltas of x [tokens, in]."""
        if not self.present[layer, group]:
            return
        if self.slots is not None:
            from .kernels import lora_expand, lora_shrink

            s = self.slots
            t = lora_shrink(x, s.a[layer][group], self.order, self.tiles)
            lora_expand(y, t, s.b[layer][group], self.order, self.tiles, s.bounds[group], s.widest[group])
            return
        for grouped, where in self.segments:
            weights = grouped[layer][group]
            if weights is None:
                continue
            a, b = weights
            if isinstance(where, slice):
                y[where].addmm_(F.linear(x[where], a), b.t())
            else:
                y.index_add_(0, where, F.linear(F.linear(x.index_select(0, where), a), b))
