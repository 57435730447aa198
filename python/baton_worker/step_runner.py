"""Executes one Step: update per-request state, build the flat batch, run the
model once over every row (prefill chunks and decodes together), sample the
rows that ask for it, and answer with a StepResult.

The engine owns scheduling and block allocation; this module only checks that
what it is told is consistent (unknown request, too few blocks, a block id out
of range, ...) and reports violations as ProtocolError naming the field.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .attention import RowSpan
from .kv_cache import KVCache, slots_for
from .model import DecoderModel
from .protocol import ProtocolError, Step, StepResult, StepTimings
from .request_state import RequestState
from .sampler import SampleOutput, Sampler

_ROW_FIELDS = ("num_new_tokens", "num_computed", "new_block_counts", "sample")


class StepRunner:
    def __init__(
        self,
        model: DecoderModel | None,
        cache: KVCache | None,
        sampler: Sampler,
        vocab_size: int,
        block_size: int,
        num_blocks: int,
        device: torch.device,
    ):
        self.model = model  # None: the dummy-null load format (no forward pass)
        self.cache = cache
        self.sampler = sampler
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = device
        self.requests: dict[int, RequestState] = {}

    def execute(self, step: Step) -> StepResult:
        t0 = time.perf_counter()
        self._remove(step)
        self._add(step)
        rows = self._rows(step)
        batch = self._build_batch(step, rows)
        t1 = time.perf_counter()
        sampled = [state for state, s in zip(rows, step.sample.tolist()) if s]
        logits = self._forward(batch) if self.model is not None and len(batch["input_ids"]) else None
        t2 = time.perf_counter()
        out = self._sample(logits, sampled, batch)
        for state, token in zip(sampled, out.token_ids.tolist()):
            state.token_ids.append(token)
        t3 = time.perf_counter()
        return StepResult(
            step_id=step.step_id,
            req_ids=np.array([s.req_id for s in sampled], dtype=np.int32),
            token_ids=out.token_ids,
            logprobs=out.logprobs,
            top_counts=out.top_counts,
            top_ids=out.top_ids,
            top_logprobs=out.top_logprobs,
            timings=StepTimings((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3),
        )

    # ------------------------------------------------------------ state updates

    def _remove(self, step: Step) -> None:
        # Unknown ids are ignored: removing twice is harmless.
        for req_id in step.removed:
            self.requests.pop(int(req_id), None)

    def _add(self, step: Step) -> None:
        for i, added in enumerate(step.added):
            where = f"Step.added[{i}]"
            if added.req_id in self.requests:
                raise ProtocolError(f"{where}.req_id", f"request {added.req_id} is already running")
            tokens = added.token_ids
            if not 0 <= added.num_prompt_tokens <= len(tokens):
                raise ProtocolError(
                    f"{where}.num_prompt_tokens", f"{added.num_prompt_tokens} is outside [0, {len(tokens)}]"
                )
            bad = np.flatnonzero((tokens < 0) | (tokens >= self.vocab_size))
            if bad.size:
                j = int(bad[0])
                raise ProtocolError(f"{where}.token_ids[{j}]", f"{int(tokens[j])} is outside the vocabulary [0, {self.vocab_size})")
            self.requests[added.req_id] = RequestState(
                req_id=added.req_id,
                token_ids=tokens.tolist(),
                num_prompt_tokens=added.num_prompt_tokens,
                sampling=added.sampling,
            )

    def _rows(self, step: Step) -> list[RequestState]:
        """Validates the per-row arrays and appends each row's new blocks.

        One pass over plain Python ints (numpy scalars are slow one at a time);
        a row that fails the combined check is re-examined by _row_error for a
        message naming the field.
        """
        n = len(step.req_ids)
        for name in _ROW_FIELDS:
            if len(getattr(step, name)) != n:
                raise ProtocolError(f"Step.{name}", f"has {len(getattr(step, name))} entries, req_ids has {n}")
        if n == 0:
            return []
        counts = step.new_block_counts
        if counts.min() < 0:
            i = int(np.flatnonzero(counts < 0)[0])
            raise ProtocolError(f"Step.new_block_counts[{i}]", f"negative count {int(counts[i])}")
        total_blocks = int(counts.sum())
        if total_blocks != len(step.new_block_ids):
            raise ProtocolError("Step.new_block_ids", f"has {len(step.new_block_ids)} ids, new_block_counts sum to {total_blocks}")
        if total_blocks and (step.new_block_ids.min() < 0 or step.new_block_ids.max() >= self.num_blocks):
            raise ProtocolError("Step.new_block_ids", f"block id outside [0, {self.num_blocks})")
        block_ids = step.new_block_ids.tolist()
        requests, block_size = self.requests, self.block_size
        rows, offset = [], 0
        columns = (step.req_ids.tolist(), counts.tolist(), step.num_computed.tolist(), step.num_new_tokens.tolist(), step.sample.tolist())
        for i, (req_id, count, start, num_new, sample) in enumerate(zip(*columns)):
            state = requests.get(req_id)
            if state is None:
                raise ProtocolError(f"Step.req_ids[{i}]", f"unknown request {req_id}")
            if count:
                state.block_table.extend(block_ids[offset : offset + count])
                offset += count
            end = start + num_new
            known = len(state.token_ids)
            if start < 0 or num_new < 0 or end > known or end > len(state.block_table) * block_size or (sample and (num_new == 0 or end != known)):
                raise self._row_error(i, start, num_new, bool(sample), state)
            rows.append(state)
        return rows

    def _row_error(self, i: int, start: int, count: int, sample: bool, state: RequestState) -> ProtocolError:
        end = start + count
        if start < 0 or count < 0:
            return ProtocolError(f"Step.num_computed[{i}]", f"negative position or count ({start}, {count})")
        if end > len(state.token_ids):
            return ProtocolError(
                f"Step.num_new_tokens[{i}]", f"row runs to position {end} but request {state.req_id} has {len(state.token_ids)} tokens"
            )
        if end > len(state.block_table) * self.block_size:
            return ProtocolError(
                f"Step.new_block_counts[{i}]",
                f"request {state.req_id} needs {-(-end // self.block_size)} blocks for {end} tokens, has {len(state.block_table)}",
            )
        return ProtocolError(f"Step.sample[{i}]", f"row ends at position {end} but request {state.req_id} has {len(state.token_ids)} tokens")

    # ------------------------------------------------------------ batch

    def _build_batch(self, step: Step, rows: list[RequestState]) -> dict:
        input_ids, positions, slots, spans, logits_indices = [], [], [], [], []
        token_start = 0
        with_model = self.model is not None
        columns = (step.num_computed.tolist(), step.num_new_tokens.tolist(), step.sample.tolist())
        for state, start, count, sample in zip(rows, *columns):
            if count == 1:
                input_ids.append(state.token_ids[start])
            else:
                input_ids.extend(state.token_ids[start : start + count])
            if with_model and count:
                table = state.block_table_tensor(self.device)
                context = slots_for(table, torch.arange(start + count, device=self.device), self.block_size)
                slots.append(context[start:])
                spans.append(RowSpan(token_start, count, start, context))
                positions.append(torch.arange(start, start + count))
            if sample:
                logits_indices.append(token_start + count - 1)
            token_start += count
        to = dict(dtype=torch.int64, device=self.device)
        return {
            "input_ids": torch.tensor(input_ids, **to),
            "positions": torch.cat(positions).to(self.device) if positions else torch.zeros(0, **to),
            "slots": torch.cat(slots) if slots else torch.zeros(0, **to),
            "rows": spans,
            "logits_indices": torch.tensor(logits_indices, **to),
        }

    def _forward(self, batch: dict) -> torch.Tensor:
        return self.model.forward(
            batch["input_ids"], batch["positions"], batch["slots"], batch["rows"], batch["logits_indices"], self.cache
        )

    def _sample(self, logits: torch.Tensor | None, sampled: list[RequestState], batch: dict) -> SampleOutput:
        if logits is None and self.model is not None:
            # An empty step: nothing ran, nothing to sample.
            return SampleOutput(np.zeros(0, np.int32), None, None, None, None)
        if logits is None:
            # dummy-null: a cheap deterministic token, (last input token + 1) % vocab.
            last = batch["input_ids"][batch["logits_indices"]] if len(sampled) else torch.zeros(0, dtype=torch.int64)
            tokens = ((last + 1) % self.vocab_size).to(torch.int32).cpu().numpy()
            wants = any(s.sampling.logprobs >= 0 for s in sampled)
            return SampleOutput(tokens, np.zeros(len(sampled), np.float32) if wants else None, None, None, None)
        return self.sampler.sample(logits, sampled)
