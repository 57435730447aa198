"""What the frame-model worker tests share (test_csm_worker_steps.py, test_qwen3_omni_talker_steps.py): a
request as the engine holds it, and a small engine that drives a frame model's StepRunner with protocol
Steps through the wire format: every step each running request runs its next chunk (or its one new
position) and samples when it reaches the end of its tokens; blocks come from a shuffled free list and go
back to it when a request is removed (finished or preempted)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from baton_worker import protocol
from baton_worker.protocol import AddedRequest, GraphWork, SamplingParams, Step


def wire(message):
    """The message as the other side reads it."""
    return protocol.decode(protocol.encode(message))


def i32(*v):
    return np.array(v, np.int32)


@dataclass
class FrameRequest:
    req_id: int
    ids: list[int]  # the prompt's token ids
    handle: int  # its rows in the worker's store (AddedRequest.embeds)
    chunk: int  # prompt (and recomputed) positions per step
    max_frames: int
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    name: str = ""  # the test's name for what it asks
    tokens: list[int] = field(default_factory=list)  # the engine's outputs (StepResult.token_ids)
    frames: list[list[int]] = field(default_factory=list)  # StepResult.frames, row by row
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    done: bool = False

    @property
    def length(self) -> int:
        return len(self.ids) + len(self.tokens)


class FrameDriver:
    """execute: a Step -> its StepResult (the worker's); width: a frame's codes; is_stop(token, frame):
    whether the sampled row ends its request (after checking the token is the frame's)."""

    def __init__(self, execute: Callable, width: int, is_stop: Callable[[int, list[int]], bool], num_blocks: int, block: int, seed: int = 0):
        self.execute_step, self.width, self.is_stop, self.block = execute, width, is_stop, block
        self.free = np.random.default_rng(seed).permutation(num_blocks).tolist()
        self.step_id = 0
        self.running: list[FrameRequest] = []
        self.added: list[AddedRequest] = []
        self.removed: list[int] = []
        self.steps_with_prefill_and_decode = 0
        self.max_sampled = 0

    def step(self, graph: GraphWork | None = None):
        """One step of every running request (and the pending adds and removals, and `graph`)."""
        rows, blocks = [], []
        prefill = decode = False
        for r in self.running:
            n = min(r.chunk, r.length - r.computed)
            end = r.computed + n
            prefill |= end < r.length or n > 1
            decode |= n == 1 and r.computed >= len(r.ids)
            new = [self.free.pop() for _ in range(-(-end // self.block) - len(r.blocks))]
            r.blocks += new
            blocks += new
            rows.append((r, n, r.computed, len(new), int(end == r.length)))
            r.computed = end
        self.steps_with_prefill_and_decode += prefill and decode
        cols = list(zip(*[(r.req_id, n, c, b, s) for r, n, c, b, s in rows])) or [()] * 5
        step = Step(self.step_id, self.added, i32(*self.removed), i32(*cols[0]), i32(*cols[1]), i32(*cols[2]), i32(*cols[3]),
                    i32(*blocks), np.array(cols[4], np.uint8), graph=graph)
        self.step_id += 1
        self.added, self.removed = [], []
        result = wire(self.execute_step(wire(step)))
        sampled = [r for r, *_, s in rows if s]
        self.max_sampled = max(self.max_sampled, len(sampled))
        assert result.req_ids.tolist() == [r.req_id for r in sampled]
        assert len(result.token_ids) == len(sampled)
        if not sampled:
            assert result.frames is None
            return result
        assert result.frames.dtype == np.int32 and result.frames.shape == (len(sampled) * self.width,)
        for r, token, frame in zip(sampled, result.token_ids.tolist(), result.frames.reshape(-1, self.width).tolist()):
            stop = self.is_stop(token, frame)
            r.tokens.append(token)
            r.frames.append(frame)
            if stop or len(r.frames) == r.max_frames:
                r.done = True
                self.remove(r)
        return result

    def add(self, r: FrameRequest) -> None:
        """Added at the next step: its prompt, and its outputs so far when it was preempted."""
        assert r.computed == 0 and not r.blocks
        self.added.append(AddedRequest(r.req_id, i32(*r.ids, *r.tokens), len(r.ids), r.sampling, embeds=r.handle))
        self.running.append(r)

    def remove(self, r: FrameRequest) -> None:
        """Removed at the next step (finished or preempted): its blocks go back to the free list."""
        self.running.remove(r)
        self.removed.append(r.req_id)
        self.free += r.blocks[::-1]
        r.blocks, r.computed = [], 0
