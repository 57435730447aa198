"""The worker's loaded adapters, by the engine's lora_id, and what each step
needs of them.

Loads and unloads come in Step.lora (the step runner checks the protocol
rules: ids, live requests); a load that fails is an answer, never an
exception: one line naming the adapter and the problem. On CUDA the
adapters of a step are also placed in slots of stacked weights for the
kernels (LoraSlots): --max-loras slots, since a step uses at most that many
adapters, each kept where it is until a step needs its slot for another
(least recently used first), so steady decoding copies nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from .adapter import LoraAdapter, LoraLayout, LoraLoadError, read_adapter
from .batch import LoraBatch


class LoraSlots:
    """The kernel path's stacks: per layer and projection group, A [slots, modules * R, in] and
    B [slots, out, R] (R = --max-lora-rank; smaller ranks and absent modules are zeros)."""

    def __init__(self, layout: LoraLayout, count: int, rank: int, device: torch.device, dtype: torch.dtype):
        self.layout = layout
        self.rank = rank
        groups = range(len(layout.groups))
        self.a = [
            [torch.zeros(count, len(layout.groups[g]) * rank, layout.in_features(g), dtype=dtype, device=device) for g in groups]
            for _ in range(layout.num_layers)
        ]
        self.b = [[torch.zeros(count, layout.bounds(g)[-1], rank, dtype=dtype, device=device) for g in groups] for _ in range(layout.num_layers)]
        self.bounds = [torch.tensor(layout.bounds(g), dtype=torch.int32, device=device) for g in groups]
        self.widest = [max(layout.shapes[m][1] for m in modules) for modules in layout.groups]
        self.owner: list[int | None] = [None] * count  # lora_id in each slot
        self.last_used = [0] * count
        self.clock = 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for stacks in (self.a, self.b) for layer in stacks for t in layer)

    def place(self, adapters: list[LoraAdapter]) -> np.ndarray:
        """The slot of each adapter (at most `count` of them), writing the ones not in a slot yet."""
        self.clock += 1
        wanted = {a.lora_id for a in adapters}
        out = np.empty(len(adapters), np.int64)
        for i, adapter in enumerate(adapters):
            if adapter.lora_id in self.owner:
                slot = self.owner.index(adapter.lora_id)
            else:
                free = [s for s, owner in enumerate(self.owner) if owner is None or owner not in wanted]
                slot = min(free, key=lambda s: (self.owner[s] is not None, self.last_used[s]))
                self._write(slot, adapter)
            self.last_used[slot] = self.clock
            out[i] = slot
        return out

    def release(self, lora_id: int) -> None:
        if lora_id in self.owner:
            self.owner[self.owner.index(lora_id)] = None

    def _write(self, slot: int, adapter: LoraAdapter) -> None:
        r = self.rank
        for layer, weights in enumerate(adapter.weights):
            for g, modules in enumerate(self.layout.groups):
                a, b = self.a[layer][g][slot], self.b[layer][g][slot]
                a.zero_()
                b.zero_()
                bounds = self.layout.bounds(g)
                for m, module in enumerate(modules):
                    if module in weights:
                        la, lb = weights[module]
                        a[m * r : m * r + la.shape[0]].copy_(la)
                        b[bounds[m] : bounds[m + 1], : lb.shape[1]].copy_(lb)
        self.owner[slot] = adapter.lora_id


class LoraManager:
    """kernels: apply adapters with the Triton kernels over slot stacks (default: on CUDA);
    keep_weights False: loads are checked but no weights kept (a worker without a forward pass)."""

    def __init__(
        self, layout: LoraLayout, max_loras: int, max_rank: int, device: torch.device, dtype: torch.dtype,
        kernels: bool | None = None, keep_weights: bool = True,
    ):
        self.layout = layout
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.device = device
        self.dtype = dtype
        self.keep_weights = keep_weights
        self.adapters: dict[int, LoraAdapter] = {}
        kernels = device.type == "cuda" if kernels is None else kernels
        self.slots = LoraSlots(layout, max_loras, max_rank, device, dtype) if kernels and keep_weights else None

    def load(self, lora_id: int, name: str, path: str) -> str | None:
        """Loads the adapter under lora_id; None, or the line that says why it failed (the id stays unknown)."""
        try:
            adapter = read_adapter(path, self.layout, self.max_rank, self.device, self.dtype, lora_id, name, self.keep_weights)
            if self.slots is None and self.keep_weights:
                adapter.grouped(self.layout)  # the torch path's weights now, not in the first step that uses them
            self.adapters[lora_id] = adapter
            return None
        except LoraLoadError as error:
            problem = str(error)
        except Exception as error:  # out of memory, a reader's own failure: this load fails, the worker serves on
            problem = f"{type(error).__name__}: {error}"
        return " ".join(f"adapter {name} ({path}): {problem}".split())

    def unload(self, lora_id: int) -> None:
        self.adapters.pop(lora_id, None)
        if self.slots is not None:
            self.slots.release(lora_id)

    def batch(self, token_lora: np.ndarray) -> LoraBatch | None:
        """The step's LoraBatch from the adapter id of each packed token (None: no token has one)."""
        return LoraBatch.build(token_lora, self.adapters, self.layout, self.device, self.slots)
