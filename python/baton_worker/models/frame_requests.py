"""What a frame model's StepRunner hook (StepRunner.frames: CSM's backbone, Qwen3-Omni's talker) keeps per
request, whatever its frames are: the request's rows per slot (what AddedRequest.embeds gave it), the frames
it generated, kept across preemption (a re-added request rebuilds its inputs from them) until the graph
request ends (GraphWork.finished_requests -> release()), and a generator per request for draws beside the
Sampler's (a depth decoder's or code predictor's codebooks)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

_SEED_STRIDE = 1_000_003  # keeps the generators of different seeds apart


class FrameRequests:
    def __init__(self, seed_salt: int):
        self.slots: dict[int, tuple[int, Any]] = {}  # slot -> (req_id, the hook's rows for it)
        self.generated: dict[int, list[np.ndarray]] = {}  # req_id -> its frames so far
        self.generators: dict[int, torch.Generator] = {}  # req_id -> its own draws' generator
        self.ended: set[int] = set()  # requests released while still in a slot (dropped at their removal)
        self.seed_salt = seed_salt

    def check_outputs(self, req_id: int, num_prompt_tokens: int, num_tokens: int) -> str | None:
        """None, or why an added request's output positions are not all frames this worker generated."""
        have = len(self.generated.get(req_id, ()))
        if num_tokens - num_prompt_tokens > have:
            return f"{num_tokens - num_prompt_tokens} output positions but this worker generated {have} frames for the request"
        return None

    def keep(self, slot: int, req_id: int, rows: Any, num_prompt_tokens: int, num_tokens: int) -> None:
        """A request added to `slot`: its rows. The engine's outputs are the frames that count: any the worker
        made beyond them (none today: a preempted request keeps its token in flight) must not sit before the
        next one."""
        self.slots[slot] = (req_id, rows)
        generated = self.generated.get(req_id)
        if generated is not None:
            del generated[num_tokens - num_prompt_tokens:]

    def remove(self, slot: int) -> None:
        entry = self.slots.pop(slot, None)
        if entry is not None and entry[0] in self.ended:
            self._drop(entry[0])

    def release(self, req_id: int) -> None:
        """The graph request ended: its generated frames are no longer needed. A request that ends while its
        rows still run (a client left; the engine's abort comes in a later step) keeps them until the step
        that removes it."""
        if any(r == req_id for r, _ in self.slots.values()):
            self.ended.add(req_id)
        else:
            self._drop(req_id)

    def _drop(self, req_id: int) -> None:
        self.ended.discard(req_id)
        self.generated.pop(req_id, None)
        self.generators.pop(req_id, None)

    def append(self, states: list, frames: np.ndarray) -> None:
        """Each sampled row's frame, appended to its request's generated frames."""
        for state, frame in zip(states, frames):
            self.generated.setdefault(state.req_id, []).append(frame)

    def generator(self, state) -> torch.Generator:
        """The request's generator, seeded from its seed when it has one."""
        g = self.generators.get(state.req_id)
        if g is None:
            g = torch.Generator()
            seed = state.sampling.seed
            if seed is None:
                g.seed()
            else:
                g.manual_seed((int(seed) * _SEED_STRIDE + self.seed_salt) % (2**63))
            self.generators[state.req_id] = g
        return g
