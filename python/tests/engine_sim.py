"""A tiny stand-in for the TypeScript engine core, for driving a StepRunner in tests.

It schedules like the real engine (decodes first, then prefill chunks within a
token budget, so chunked prefill and decodes share steps), hands out block ids
from a shuffled pool (non-contiguous, out of order), builds Step messages and
round-trips them through the real wire codec before executing them.

With overlap=True it also schedules as the engine's overlap ("async") mode
does: step N+1 is built and launched (StepRunner.launch) before step N is
finished, a row sampled at N counting its token as known; results are
applied in order, two steps at most outstanding.

With spec_tokens=K (speculative decoding, the worker started with
--num-speculative-tokens K) it schedules drafts as the engine does: a decode
row whose request got proposals in the last result (StepResult.draft_counts /
draft_ids) carries up to K of them in Step.spec (fewer where the token budget
or max_new_tokens leave less room), runs 1 + d tokens and samples; the
result's token_counts say how many tokens it appended, and num_computed goes
back to the last appended token (the rejected drafts' KV is recomputed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from baton_worker import protocol
from baton_worker.protocol import AddedRequest, SamplingParams, SpecWork, Step


@dataclass
class SimRequest:
    req_id: int
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    arrive_step: int = 0
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    added: bool = False
    done: bool = False
    in_flight: int = 0  # sampled tokens of launched steps not applied yet
    logprobs: list[float] = field(default_factory=list)
    tops: list[tuple[list[int], list[float]]] = field(default_factory=list)
    # AddedRequest.prompt_logprobs; what came back, per prompt position: (logprob, rank, top ids, top logprobs).
    prompt_logprobs: int = -1
    prompt_results: list[tuple[float, int, list[int], list[float]]] = field(default_factory=list)
    lora_id: int = 0  # AddedRequest.lora_id: the adapter its rows run with (0: the base model)
    proposal: list[int] = field(default_factory=list)  # the worker's drafts for the next step (speculative decoding)
    drafts: int = 0  # drafts the step in flight carries
    embeds: int = -1  # AddedRequest.embeds: a handle in the runner's store (embeds_of)
    positions: int = -1  # AddedRequest.positions: likewise

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt) :]


class EngineSim:
    def __init__(self, runner, block_size: int, num_blocks: int, token_budget: int = 8, seed: int = 0, overlap: bool = False,
                 max_loras: int | None = None, spec_tokens: int = 0):
        """max_loras: as the engine's --max-loras, the most distinct adapters a step's rows use (a row that
        would add one more waits). spec_tokens: the most drafts a row carries (0: no speculative decoding)."""
        self.runner = runner
        self.spec_tokens = spec_tokens
        # Speculative decoding's counts: drafts proposed (in results), scheduled, accepted and rejected.
        self.proposed = self.scheduled = self.accepted = self.rejected = 0
        self.max_loras = max_loras
        self.overlap = overlap
        self.outstanding: list = []  # (launched step, its rows), oldest first
        self.overlapped = 0  # steps launched while another was outstanding
        self.block_size = block_size
        self.rng = random.Random(seed)
        self.free = list(range(num_blocks))
        self.rng.shuffle(self.free)
        self.token_budget = token_budget
        self.step_id = 0
        self.pending_removals: list[int] = []
        self.pending_lora = None  # a LoraWork for the next step
        self.results: list[protocol.StepResult] = []
        self.steps: list[Step] = []

    def run(self, requests: list[SimRequest], max_steps: int = 1000) -> list[SimRequest]:
        for r in requests:
            r.tokens = list(r.prompt)
        while not all(r.done for r in requests) or self.outstanding:
            self.step(requests)
            if self.step_id > max_steps:
                raise RuntimeError("simulation did not finish")
        return requests

    def preempt(self, r: SimRequest) -> None:
        """As the engine preempts by recomputation: the request's blocks are freed,
        the worker is told to drop it, and it comes back later as a new
        AddedRequest with its prompt and outputs so far (same id, same prompt length)."""
        self.free += r.blocks
        r.blocks = []
        r.num_computed = 0
        r.added = False
        self.pending_removals.append(r.req_id)

    def step(self, requests: list[SimRequest]) -> None:
        step, rows = self._schedule(requests)
        if not self.overlap:
            result = protocol.decode(protocol.encode(self.runner.execute(protocol.decode(protocol.encode(step)))))
            self._apply(result, rows)
            return
        if rows:
            wire = protocol.decode(protocol.encode(step))
            if self.outstanding and not self.runner.overlaps(wire):
                self._finish_oldest()
            self.overlapped += bool(self.outstanding)
            self.outstanding.append((self.runner.launch(wire), rows))
        if len(self.outstanding) == 2 or (self.outstanding and not rows):
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        launched, rows = self.outstanding.pop(0)
        self._apply(protocol.decode(protocol.encode(launched.finish())), rows)

    def _schedule(self, requests: list[SimRequest]) -> tuple[Step, list]:
        live = [r for r in requests if not r.done and r.arrive_step <= self.step_id and len(r.output) + r.in_flight < r.max_new_tokens]
        known = {r.req_id: len(r.tokens) + r.in_flight for r in live}
        decodes = [r for r in live if r.added and r.num_computed == known[r.req_id] - 1]
        prefills = [r for r in live if r not in decodes]
        budget = self.token_budget
        rows: list[tuple[SimRequest, int]] = []
        adapters: set[int] = set()
        draft_counts, draft_ids = [], []
        for r in decodes + prefills:
            count = min(known[r.req_id] - r.num_computed, budget)
            if count <= 0:
                continue
            r.drafts = 0
            if r in decodes and r.proposal and not self.overlap:
                # The row appends up to d + 1 tokens: leave room for them within max_new_tokens and the budget.
                r.drafts = max(0, min(len(r.proposal), self.spec_tokens, r.max_new_tokens - len(r.output) - 1, budget - count))
                draft_ids += r.proposal[: r.drafts]
                count += r.drafts
            draft_counts.append(r.drafts)
            if self.max_loras is not None and r.lora_id and r.lora_id not in adapters:
                if len(adapters) >= self.max_loras:
                    continue
                adapters.add(r.lora_id)
            rows.append((r, count))
            budget -= count
        added = []
        for r, _ in rows:
            if not r.added:
                r.added = True
                added.append(AddedRequest(r.req_id, np.array(r.tokens, np.int32), len(r.prompt), r.sampling, r.prompt_logprobs,
                                          embeds=r.embeds, lora_id=r.lora_id, positions=r.positions))
        counts, new_ids = [], []
        for r, count in rows:
            need = -(-(r.num_computed + count) // self.block_size) - len(r.blocks)
            fresh = [self.free.pop() for _ in range(max(need, 0))]
            r.blocks += fresh
            counts.append(len(fresh))
            new_ids += fresh
        sample = [int(r.num_computed + c == known[r.req_id] + r.drafts) for r, c in rows]
        step = Step(
            step_id=self.step_id,
            added=added,
            removed=np.array(self.pending_removals, np.int32),
            req_ids=np.array([r.req_id for r, _ in rows], np.int32),
            num_new_tokens=np.array([c for _, c in rows], np.int32),
            num_computed=np.array([r.num_computed for r, _ in rows], np.int32),
            new_block_counts=np.array(counts, np.int32),
            new_block_ids=np.array(new_ids, np.int32),
            sample=np.array(sample, np.uint8),
            lora=self.pending_lora,
            spec=SpecWork(np.array(draft_counts, np.int32), np.array(draft_ids, np.int32)) if draft_ids else None,
        )
        self.scheduled += len(draft_ids)
        self.pending_removals = []
        self.pending_lora = None
        self.steps.append(step)
        for (r, count), s in zip(rows, sample):
            r.num_computed += count
            r.in_flight += s
        self.step_id += 1
        return step, rows

    def _apply(self, result: protocol.StepResult, rows: list) -> None:
        self.results.append(result)
        by_id = {r.req_id: r for r, _ in rows}
        if result.prompt_counts is not None:
            at = top_at = 0
            for (r, _), count in zip(rows, result.prompt_counts.tolist()):
                k = min(r.prompt_logprobs, self.runner.vocab_size)
                for j in range(at, at + count):
                    ids = result.prompt_top_ids[top_at : top_at + k].tolist()
                    lps = result.prompt_top_logprobs[top_at : top_at + k].tolist()
                    r.prompt_results.append((float(result.prompt_logprobs[j]), int(result.prompt_ranks[j]), ids, lps))
                    top_at += k
                at += count
        top_offset = 0
        counts = result.token_counts.tolist() if result.token_counts is not None else [1] * len(result.req_ids)
        starts = np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))
        draft_at = 0
        for i, req_id in enumerate(result.req_ids):
            r = by_id[int(req_id)]
            r.in_flight -= 1
            r.tokens += result.token_ids[starts[i] : starts[i + 1]].tolist()
            if r.drafts:
                accepted = counts[i] - 1
                self.accepted += accepted
                self.rejected += r.drafts - accepted
                r.num_computed = len(r.tokens) - 1  # the last appended token's KV is computed next step
                r.drafts = 0
            r.proposal = []
            if result.draft_counts is not None:
                n = int(result.draft_counts[i])
                r.proposal = result.draft_ids[draft_at : draft_at + n].tolist()
                draft_at += n
                self.proposed += n
            # Logprobs come token by token (a row with drafts appends several).
            for j in range(int(starts[i]), int(starts[i + 1])):
                if result.logprobs is not None:
                    r.logprobs.append(float(result.logprobs[j]))
                if result.top_counts is not None:
                    n = int(result.top_counts[j])
                    r.tops.append((result.top_ids[top_offset : top_offset + n].tolist(), result.top_logprobs[top_offset : top_offset + n].tolist()))
                    top_offset += n
            if len(r.output) >= r.max_new_tokens:
                r.done = True
                self.free += r.blocks
                r.blocks = []
                self.pending_removals.append(r.req_id)
