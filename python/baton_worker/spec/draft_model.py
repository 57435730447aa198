"""Draft-model proposals (vLLM's `draft_model` speculative method): a smaller
decoder with the target's vocabulary, loaded by the same worker, greedily
proposes K tokens for each row after every step.

The draft keeps its own paged KV cache, which the worker manages alone (the
engine's blocks address the target's cache only): a free list of blocks, a
block list per slot, freed when the request leaves (release). Per slot it
remembers how many leading positions its cache holds the request's own tokens
for (`valid`), and which drafts it wrote after them last time (`written`):
the next call counts the drafts that verification kept as still valid, so a
row's catch-up is only the tokens the draft has not seen (the bonus token,
usually, or a whole prompt the first time).

One call, for all the rows it is given: a catch-up forward of every row's
unseen tokens (like a prefill chunk each) gives each row's first draft from
its last position, then K - 1 one-token forwards of all rows together give
the rest. Blocks are reserved up front for every position written; a row the
cache cannot hold now, or one past the draft's longest position, gets no
drafts (the target decodes it as usual).
"""

from __future__ import annotations

import numpy as np
import torch

from ..attention import AttentionBackend, AttentionMetadata
from ..model.decoder import DecoderModel
from ..sampling.sampler import first_argmax


class DraftModelProposer:
    def __init__(self, model: DecoderModel, attention: AttentionBackend, num_blocks: int, block_size: int, k: int,
                 max_positions: int, device: torch.device):
        if k < 1:
            raise ValueError(f"bad draft-model proposer settings k={k}")
        self.model, self.attention = model, attention
        self.k, self.block_size, self.max_positions, self.device = k, block_size, max_positions, device
        self.num_blocks = num_blocks
        self.free = list(range(num_blocks - 1, -1, -1))
        self.blocks: dict[int, list[int]] = {}  # slot -> its blocks, in position order
        self.valid: dict[int, int] = {}  # slot -> leading positions whose KV is the request's own tokens
        self.written: dict[int, tuple[int, np.ndarray]] = {}  # slot -> (first position, drafts written there last call)

    # ------------------------------------------------------------ per-slot state

    def release(self, slot: int) -> None:
        """The request in `slot` left: its blocks go back (a later request in the slot starts over)."""
        self.free += reversed(self.blocks.pop(slot, []))
        self.valid.pop(slot, None)
        self.written.pop(slot, None)

    def _seen(self, slot: int, tokens: np.ndarray) -> int:
        """Leading positions of `tokens` already in the draft's cache (at least one token is left to run)."""
        valid = self.valid.get(slot, 0)
        written = self.written.pop(slot, None)
        if written is not None:
            start, drafts = written
            known = tokens[start : start + len(drafts)]
            match = known == drafts[: len(known)]
            valid = start + (int(np.argmin(match)) if not match.all() else len(known))
        return min(valid, len(tokens) - 1)

    def _reserve(self, slot: int, positions: int) -> bool:
        """Blocks for `positions` positions of `slot`; False (nothing taken) when the cache cannot hold them."""
        have = self.blocks.setdefault(slot, [])
        need = -(-positions // self.block_size) - len(have)
        if need <= 0:
            return True
        if need > len(self.free):
            return False
        have += [self.free.pop() for _ in range(need)]
        return True

    # ------------------------------------------------------------ proposing

    def propose_rows(self, slots: list[int], tokens: list[np.ndarray]) -> list[np.ndarray]:
        """K greedy drafts for each row (slots[i] holding the known tokens[i]); empty for a row it cannot draft."""
        out = [np.zeros(0, np.int32)] * len(slots)
        k = self.k
        rows, starts = [], []
        for i, (slot, known) in enumerate(zip(slots, tokens)):
            length = len(known)
            if length == 0 or length + k - 1 > self.max_positions or not self._reserve(slot, length + k - 1):
                continue
            rows.append(i)
            starts.append(self._seen(slot, known))
        if not rows:
            return out
        lengths = np.array([len(tokens[i]) for i in rows], np.int64)
        starts = np.array(starts, np.int64)
        # Catch-up: every row's unseen tokens; the logits of its last one give the first draft.
        ids = np.concatenate([tokens[i][s:] for i, s in zip(rows, starts.tolist())]).astype(np.int64)
        drafts = np.zeros((len(rows), k), np.int64)
        drafts[:, 0] = self._forward(rows, slots, ids, starts, lengths - starts)
        # Then one token a row at a time: draft j at position length + j - 1 gives draft j + 1.
        for j in range(1, k):
            drafts[:, j] = self._forward(rows, slots, drafts[:, j - 1], lengths + j - 1, np.ones(len(rows), np.int64))
        for r, i in enumerate(rows):
            slot = slots[i]
            self.valid[slot] = int(lengths[r])
            self.written[slot] = (int(lengths[r]), drafts[r, : k - 1].copy())
            out[i] = drafts[r].astype(np.int32)
        return out

    def _forward(self, rows: list[int], slots: list[int], ids: np.ndarray, start: np.ndarray, count: np.ndarray) -> np.ndarray:
        """One forward of the draft over rows' new tokens (ids, row after row; row r's at positions
        start[r] .. start[r] + count[r] - 1); the argmax at each row's last token."""
        bs = self.block_size
        query_start = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(count, out=query_start[1:])
        row_of = np.repeat(np.arange(len(rows)), count)
        positions = np.arange(int(query_start[-1])) + (start - query_start[:-1])[row_of]
        seq_lens = start + count
        pages = int(-(-seq_lens.max() // bs))
        table = np.zeros((len(rows), pages), np.int64)
        for r, i in enumerate(rows):
            have = self.blocks[slots[i]][:pages]
            table[r, : len(have)] = have
        slot_mapping = table[row_of, positions // bs] * bs + positions % bs
        dev = self.device
        meta = AttentionMetadata(torch.from_numpy(slot_mapping).to(dev), query_start, seq_lens, torch.from_numpy(table).to(dev), bs)
        model = self.model
        hidden = model.hidden_states(torch.from_numpy(ids).to(dev), torch.from_numpy(positions).to(dev), self.attention.prepare(meta))
        last = torch.from_numpy(query_start[1:] - 1).to(dev)
        return first_argmax(model.logits(hidden, last)).cpu().numpy().astype(np.int64)
