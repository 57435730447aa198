"""The logits rules Whisper's generate applies to every next-token score,
reproduced from transformers (generation_whisper.py _retrieve_logit_processors
and generation/logits_process.py), in their order:

  1. begin suppress (SuppressTokensAtBeginLogitsProcessor): at the first
     generated token, begin_suppress_tokens (a lone space, <|endoftext|>)
     are -inf, so a transcript does not start empty;
  2. suppress (SuppressTokensLogitsProcessor): suppress_tokens (non-speech
     symbols, control tokens) are always -inf;
  3. timestamps (WhisperTimeStampLogitsProcessor), only when timestamps are on:
     <|notimestamps|> is never sampled; timestamps come in pairs (after a
     lone timestamp only another timestamp or <|endoftext|>; after a pair, no
     timestamp); they never decrease (and a pair's successor is strictly
     later); the first token is a timestamp no later than
     max_initial_timestamp_index; and where the timestamps' total probability
     beats every single text token, the text tokens are -inf.

"First generated token" and the timestamp history count from the end of the
prompt (begin_index = the number of prompt tokens, earlier text given with
<|startofprev|> included), as transformers counts them.

The rules hold for transcription prompts only: a prompt ending with a task
token (<|transcribe|>, <|translate|>: timestamps on) or with <|notimestamps|>
(timestamps off). Any other prompt (<|startoftranscript|> alone asks for the
language) gets its logits untouched.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Rule sets of a row, by how its prompt ends.
NONE, PLAIN, TIMESTAMPS = 0, 1, 2
# Ranges [lo, hi) of vocabulary ids a timestamp row can have masked: <|notimestamps|>, the pairing rule,
# the monotonic rule, and the first token's two (text ids; timestamps past the initial limit).
_RANGES = 5


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


class WhisperLogitsRules:
    """generation_config: generation_config.json's dict; vocab_size: the logits' width."""

    def __init__(self, generation_config: dict[str, Any], vocab_size: int):
        g = generation_config
        self.vocab_size = vocab_size
        suppress = g.get("suppress_tokens")
        begin = g.get("begin_suppress_tokens")
        self.suppress = None if suppress is None else self._index(_ids(suppress))
        self.begin_suppress = None if begin is None else self._index(_ids(begin))
        no_timestamps = g.get("no_timestamps_token_id")
        self.no_timestamps = None if no_timestamps is None else int(no_timestamps)
        # Without <|notimestamps|> in the config transformers cannot turn timestamps on: task-ended prompts get the
        # suppress rules only.
        self.timestamp_begin = None if no_timestamps is None else int(no_timestamps) + 1
        eos = _ids(g.get("eos_token_id")) or _ids(g.get("bos_token_id"))
        self.eos = eos[0] if eos else None
        initial = g.get("max_initial_timestamp_index")
        self.max_initial_timestamp_index = None if initial is None else int(initial)
        self.from_logprob = bool(g.get("_detect_timestamp_from_logprob", True))
        self.task_ids = frozenset(_ids(list((g.get("task_to_id") or {}).values())))
        # An English-only model's prompt has no language or task: <|startoftranscript|> alone asks for timestamps.
        start = g.get("decoder_start_token_id")
        english_only = not g.get("is_multilingual", bool(self.task_ids))
        self.timestamps_after_start = None if start is None or not english_only else int(start)
        self._devices: dict[torch.device, tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]] = {}

    @classmethod
    def from_dir(cls, model_dir: Path | str) -> WhisperLogitsRules:
        """From the model directory's generation_config.json (and config.json's vocab_size)."""
        model_dir = Path(model_dir)
        generation = json.loads((model_dir / "generation_config.json").read_text())
        config = json.loads((model_dir / "config.json").read_text())
        return cls(generation, int(config["vocab_size"]))

    def _index(self, ids: list[int]) -> torch.Tensor:
        # transformers' isin over the vocabulary ignores ids outside it.
        return torch.tensor(sorted({i for i in ids if 0 <= i < self.vocab_size}), dtype=torch.int64)

    def _on(self, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """(suppressed ids, begin-suppressed ids, vocabulary ids) on the logits' device."""
        if device not in self._devices:
            to = lambda m: None if m is None else m.to(device)  # noqa: E731
            self._devices[device] = (to(self.suppress), to(self.begin_suppress), torch.arange(self.vocab_size, device=device))
        return self._devices[device]

    def kind(self, tokens: Sequence[int], num_prompt: int) -> int:
        """Which rules apply to a row with this prompt (tokens[:num_prompt]): NONE, PLAIN or TIMESTAMPS."""
        if num_prompt < 1:
            return NONE
        last = int(tokens[num_prompt - 1])
        if (last in self.task_ids or last == self.timestamps_after_start) and self.timestamp_begin is not None:
            return TIMESTAMPS
        if last in self.task_ids or (self.no_timestamps is not None and last == self.no_timestamps):
            return PLAIN
        return NONE

    def apply(self, logits: torch.Tensor, rows: list[tuple[Sequence[int], int]]) -> torch.Tensor:
        """logits: float32 [R, vocab], the next-token scores of R rows; rows[r]: (the row's token ids so far,
        prompt then generated; the prompt's length). Returns the scores with the rules applied (a new tensor
        where any rule applies, else `logits` itself)."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} rows of logits but {len(rows)} token histories")
        if logits.shape[-1] != self.vocab_size:
            raise ValueError(f"logits have {logits.shape[-1]} ids; the rules were built for {self.vocab_size}")
        kinds = [self.kind(tokens, n) for tokens, n in rows]
        active = [r for r, k in enumerate(kinds) if k != NONE]
        if not active:
            return logits
        device = logits.device
        suppress, begin_suppress, vocab = self._on(device)
        # One copy of the logits, edited in place: rows by index_fill over the few suppressed ids (a full-width
        # mask or a gather of the rows would each read the whole [rows, vocab] again).
        out = logits.clone()
        every = len(active) == len(rows)
        if begin_suppress is not None:
            for r in active:
                if len(rows[r][0]) == rows[r][1]:
                    out[r].index_fill_(0, begin_suppress, float("-inf"))
        if suppress is not None:
            if every:
                out.index_fill_(1, suppress, float("-inf"))
            else:
                for r in active:
                    out[r].index_fill_(0, suppress, float("-inf"))
        timed = [r for r in active if kinds[r] == TIMESTAMPS]
        if len(timed) == len(rows):
            self._timestamps(out, rows, vocab)
        elif timed:
            at = torch.tensor(timed, device=device)
            out.index_copy_(0, at, self._timestamps(out.index_select(0, at), [rows[r] for r in timed], vocab))
        return out

    def _timestamps(self, scores: torch.Tensor, rows: list[tuple[Sequence[int], int]], vocab: torch.Tensor) -> torch.Tensor:
        """WhisperTimeStampLogitsProcessor over rows whose timestamps are on; scores [n, vocab] are modified in place."""
        assert self.timestamp_begin is not None and self.no_timestamps is not None
        tb, size = self.timestamp_begin, self.vocab_size
        eos = self.eos if self.eos is not None else size  # transformers slices [:None]: every id
        # Each row's masked ranges, found on the host from its generated tokens, then one masked_fill per range slot.
        lo = np.zeros((len(rows), _RANGES), dtype=np.int64)
        hi = np.zeros((len(rows), _RANGES), dtype=np.int64)
        for k, (tokens, num_prompt) in enumerate(rows):
            seq = np.asarray(tokens[num_prompt:], dtype=np.int64)
            lo[k, 0], hi[k, 0] = self.no_timestamps, self.no_timestamps + 1
            last_was_timestamp = len(seq) >= 1 and seq[-1] >= tb
            penultimate_was_timestamp = len(seq) < 2 or seq[-2] >= tb
            if last_was_timestamp:
                if penultimate_was_timestamp:  # a pair just closed: text next
                    lo[k, 1], hi[k, 1] = tb, size
                else:  # a lone timestamp: its partner or <|endoftext|>, no text
                    lo[k, 1], hi[k, 1] = 0, eos
            stamps = seq[seq >= tb]
            if len(stamps):
                last = int(stamps[-1]) if last_was_timestamp and not penultimate_was_timestamp else int(stamps[-1]) + 1
                lo[k, 2], hi[k, 2] = tb, last
            if len(seq) == 0:  # the first generated token is a timestamp, and an early one
                lo[k, 3], hi[k, 3] = 0, tb
                if self.max_initial_timestamp_index is not None:
                    lo[k, 4], hi[k, 4] = tb + self.max_initial_timestamp_index + 1, size
        lo_t = torch.from_numpy(lo).to(scores.device)
        hi_t = torch.from_numpy(hi).to(scores.device)
        for j in range(_RANGES):
            if (hi[:, j] > lo[:, j]).any():
                scores.masked_fill_((vocab >= lo_t[:, j, None]) & (vocab < hi_t[:, j, None]), float("-inf"))
        if self.from_logprob:
            # Where the timestamps together are likelier than any single text token, a timestamp it is.
            logprobs = torch.nn.functional.log_softmax(scores.float(), dim=-1)
            timestamp = logprobs[:, tb:].logsumexp(dim=-1)
            text = logprobs[:, :tb].max(dim=-1).values
            scores.masked_fill_((timestamp > text)[:, None] & (vocab < tb), float("-inf"))
        return scores
