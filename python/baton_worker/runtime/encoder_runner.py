"""Executes Steps for a bidirectional encoder (a pooling model without a KV
cache): every row is a request's whole prompt (the engine never chunks such
a request, Ready.pooling.causal false), the step's rows run as one packed
forward pass, and each row's pooled vector goes back in StepResult.pooled.

Block ids in the Step are the engine's bookkeeping only: nothing is cached,
so they are accepted and ignored. A cross-encoder's rows answer with their
logits (its head over the CLS row); a pair's second text is token type 1.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ..model.encoder import EncoderModel, EncoderPlan
from ..model.pooling import PoolingConfig, finish_vectors, pool_rows, pooled_result
from ..protocol import ProtocolError, Step, StepResult, StepTimings


class EncoderRunner:
    def __init__(self, model: EncoderModel, pooling: PoolingConfig, vocab_size: int, device: torch.device, separator: int | None = None):
        """separator: the token after which a pair's second segment starts (None: one segment)."""
        self.model = model
        self.pooling = pooling
        self.separator = separator
        self.vocab_size = vocab_size
        self.device = device
        self.prompts: dict[int, np.ndarray] = {}  # req_id -> prompt token ids
        self.embeds_of = None  # set by GraphStepRunner; an encoder takes no prompt embeddings

    def overlaps(self, step: Step) -> bool:
        return False

    def execute(self, step: Step, wait_mask=None) -> StepResult:
        t0 = time.perf_counter()
        if step.lora is not None:
            raise ProtocolError("Step.lora", "an encoder (a pooling model) serves no LoRA adapters")
        if step.spec is not None:
            raise ProtocolError("Step.spec", "an encoder (a pooling model) does no speculative decoding (--num-speculative-tokens 0)")
        for req_id in step.removed.tolist():
            self.prompts.pop(req_id, None)
        for i, added in enumerate(step.added):
            if added.lora_id != 0:
                raise ProtocolError(f"Step.added[{i}].lora_id", "an encoder (a pooling model) serves no LoRA adapters")
            tokens = np.asarray(added.token_ids, np.int64)
            if len(tokens) and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
                raise ProtocolError(f"Step.added[{i}].token_ids", f"a token is outside the vocabulary [0, {self.vocab_size})")
            self.prompts[added.req_id] = tokens
        if len(step.mask_rows):
            raise ProtocolError("Step.mask_rows", "a pooling model samples no tokens")
        rows = self._rows(step)
        empty = np.zeros(0, np.int32)
        if not rows:
            return StepResult(step.step_id, empty, empty, None, None, None, None, StepTimings())
        query_start = np.zeros(len(rows) + 1, np.int64)
        np.cumsum([len(r) for r in rows], out=query_start[1:])
        input_ids = torch.from_numpy(np.concatenate(rows)).to(self.device)
        positions = torch.from_numpy(self.model.positions(query_start)).to(self.device)
        plan = EncoderPlan(query_start)
        t1 = time.perf_counter()
        hidden = self.model.forward(input_ids, positions, plan, self._token_types(rows))
        vectors = finish_vectors(pool_rows(hidden, query_start, self.pooling.pooling_type), self.pooling.normalize, self.model.classifier)
        t2 = time.perf_counter()
        return pooled_result(step.step_id, step.req_ids, vectors.reshape(-1), t0, t1, t2)

    def _token_types(self, rows: list[np.ndarray]) -> torch.Tensor | None:
        """Segment 1 after each row's first separator (past its first token), as the pair template types it."""
        if self.separator is None:
            return None
        types = []
        for row in rows:
            t = np.zeros(len(row), np.int64)
            hits = np.flatnonzero(row[1:] == self.separator)
            if len(hits):
                t[hits[0] + 2 :] = 1
            types.append(t)
        return torch.from_numpy(np.concatenate(types)).to(self.device)

    def _rows(self, step: Step) -> list[np.ndarray]:
        """Each row's prompt; a row must be a whole prompt that is pooled."""
        out = []
        for i, req_id in enumerate(step.req_ids.tolist()):
            prompt = self.prompts.get(req_id)
            if prompt is None:
                raise ProtocolError(f"Step.req_ids[{i}]", f"unknown request {req_id}")
            if step.num_computed[i] != 0 or step.num_new_tokens[i] != len(prompt) or not step.sample[i]:
                raise ProtocolError(
                    f"Step.num_new_tokens[{i}]",
                    f"an encoder runs whole prompts: request {req_id} has {len(prompt)} tokens, the row runs "
                    f"{int(step.num_new_tokens[i])} from {int(step.num_computed[i])} (sample {int(step.sample[i])})",
                )
            out.append(prompt)
        return out
