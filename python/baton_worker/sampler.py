"""Sampling on the worker, with vLLM semantics.

Order per row: raw logprobs (for the response) from log_softmax of the raw
logits; min_tokens suppression; repetition penalty (prompt + output tokens),
frequency and presence penalties (output tokens only); then greedy argmax when
temperature is 0, else temperature, min-p, top-k, top-p and a multinomial draw
from the request's own generator when it has a seed (the global one
otherwise). Rows that need nothing but argmax are handled in one batched call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .request_state import RequestState

# Below this temperature a request is treated as greedy (vLLM's _SAMPLING_EPS).
SAMPLING_EPS = 1e-5


@dataclass
class SampleOutput:
    token_ids: np.ndarray  # int32 [rows]
    logprobs: np.ndarray | None  # float32 [rows]
    top_counts: np.ndarray | None  # int32 [rows]
    top_ids: np.ndarray | None  # int32 [sum(top_counts)]
    top_logprobs: np.ndarray | None  # float32 [sum(top_counts)]


def is_greedy(state: RequestState) -> bool:
    return state.sampling.temperature < SAMPLING_EPS


def _needs_processing(state: RequestState) -> bool:
    s = state.sampling
    return (
        not is_greedy(state)
        or s.repetition_penalty != 1.0
        or s.frequency_penalty != 0.0
        or s.presence_penalty != 0.0
        or (state.num_output_tokens < s.min_tokens and len(s.suppress_token_ids) > 0)
    )


class Sampler:
    def __init__(self, seed: int, device: torch.device):
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def sample(self, logits: torch.Tensor, states: list[RequestState]) -> SampleOutput:
        """logits: float32 [rows, vocab], one row per request that samples this step."""
        tokens = torch.argmax(logits, dim=-1) if logits.shape[0] else torch.zeros(0, dtype=torch.int64)
        for i, state in enumerate(states):
            if _needs_processing(state):
                tokens[i] = self._sample_row(logits[i], state)
        token_ids = tokens.to(torch.int32).cpu().numpy()
        return self._with_logprobs(logits, states, token_ids)

    def _sample_row(self, raw: torch.Tensor, state: RequestState) -> int:
        s = state.sampling
        logits = raw.clone()
        if state.num_output_tokens < s.min_tokens and len(s.suppress_token_ids) > 0:
            ids = torch.as_tensor(np.asarray(s.suppress_token_ids, dtype=np.int64), device=logits.device)
            logits[ids[ids < logits.numel()]] = float("-inf")
        logits = self._apply_penalties(logits, state)
        if is_greedy(state):
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / s.temperature, dim=-1)
        ids, weights = _restrict(probs, s.min_p, s.top_k, s.top_p)
        # Inverse-CDF draw: one uniform number from the request's generator;
        # much cheaper than multinomial over a 150k vocabulary.
        cdf = torch.cumsum(weights, dim=0)
        u = torch.rand(1, generator=self._generator_for(state), device=cdf.device) * cdf[-1]
        pick = int(torch.searchsorted(cdf, u, right=True).clamp(max=cdf.numel() - 1))
        return pick if ids is None else int(ids[pick])

    def _generator_for(self, state: RequestState) -> torch.Generator:
        if state.sampling.seed is None:
            return self.generator
        if state.generator is None:
            state.generator = torch.Generator(device=self.device)
            state.generator.manual_seed(state.sampling.seed & 0xFFFF_FFFF_FFFF_FFFF)
        return state.generator

    def _apply_penalties(self, logits: torch.Tensor, state: RequestState) -> torch.Tensor:
        s = state.sampling
        if s.repetition_penalty == 1.0 and s.frequency_penalty == 0.0 and s.presence_penalty == 0.0:
            return logits
        _update_counts(state, logits.numel(), logits.device)
        if s.repetition_penalty != 1.0:
            penalised = torch.where(logits > 0, logits / s.repetition_penalty, logits * s.repetition_penalty)
            logits = torch.where(state.seen_mask, penalised, logits)
        if s.frequency_penalty != 0.0 or s.presence_penalty != 0.0:
            counts = state.output_counts.to(logits.dtype)
            logits = logits - s.frequency_penalty * counts - s.presence_penalty * (counts > 0).to(logits.dtype)
        return logits

    def _with_logprobs(self, logits: torch.Tensor, states: list[RequestState], token_ids: np.ndarray) -> SampleOutput:
        wanted = [s.sampling.logprobs for s in states]
        if not any(n >= 0 for n in wanted):
            return SampleOutput(token_ids, None, None, None, None)
        # vLLM's default: logprobs of the raw (unprocessed) distribution.
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, torch.as_tensor(token_ids, dtype=torch.int64, device=logits.device)[:, None])
        out = SampleOutput(token_ids, chosen[:, 0].cpu().numpy().astype(np.float32), None, None, None)
        if not any(n > 0 for n in wanted):
            return out
        vocab = logprobs.shape[1]
        counts = np.array([min(max(n, 0), vocab) for n in wanted], dtype=np.int32)
        top_ids, top_lps = [], []
        for i, n in enumerate(counts):
            if n > 0:
                values, ids = torch.topk(logprobs[i], int(n))
                top_ids.append(ids.cpu().numpy().astype(np.int32))
                top_lps.append(values.cpu().numpy().astype(np.float32))
        out.top_counts = counts
        out.top_ids = np.concatenate(top_ids) if top_ids else np.zeros(0, np.int32)
        out.top_logprobs = np.concatenate(top_lps) if top_lps else np.zeros(0, np.float32)
        return out


def _update_counts(state: RequestState, vocab: int, device: torch.device) -> None:
    """Brings the request's penalty tensors up to date with its token list."""
    if state.output_counts is None:
        state.output_counts = torch.zeros(vocab, dtype=torch.int32, device=device)
        state.seen_mask = torch.zeros(vocab, dtype=torch.bool, device=device)
        state.counted = 0
    new = torch.as_tensor(state.token_ids[state.counted :], dtype=torch.int64, device=device)
    new_outputs = state.token_ids[max(state.counted, state.num_prompt_tokens) :]
    new = new[new < vocab]
    state.seen_mask[new] = True
    if new_outputs:
        out = torch.as_tensor(new_outputs, dtype=torch.int64, device=device)
        out = out[out < vocab]
        state.output_counts += torch.bincount(out, minlength=vocab).to(torch.int32)
    state.counted = len(state.token_ids)


def _restrict(probs: torch.Tensor, min_p: float, top_k: int, top_p: float) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The support left by min-p, then top-k, then top-p (vLLM's order and rules).

    Returns (token ids, unnormalised weights); ids None means weights cover
    the whole vocabulary in token order. Top-p keeps the most likely tokens
    until the ones before a token already hold top_p of the mass (vLLM: drop
    the ascending-sorted tail whose cumulative mass is <= 1 - top_p); it grows
    a top-k window instead of sorting the whole vocabulary.
    """
    if min_p > 0.0:
        probs = torch.where(probs < probs.max() * min_p, torch.zeros_like(probs), probs)
    ids, weights = None, probs
    vocab = probs.numel()
    if 0 < top_k < vocab:
        weights, ids = torch.topk(probs, top_k)
    if top_p < 1.0:
        if ids is None:
            weights, ids = _top_mass(probs, top_p)
        total = weights.sum()
        before = torch.cumsum(weights, dim=0) - weights  # mass of the more likely tokens
        keep = int((before < top_p * total).sum().clamp(min=1))
        weights, ids = weights[:keep], ids[:keep]
    return ids, weights


def _top_mass(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest descending top-k window that holds top_p of the mass."""
    total = probs.sum()
    k = 64
    while True:
        k = min(k, probs.numel())
        weights, ids = torch.topk(probs, k)
        if k == probs.numel() or weights.sum() >= top_p * total:
            return weights, ids
        k *= 4
