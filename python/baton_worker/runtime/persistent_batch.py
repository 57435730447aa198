"""The persistent batch: per-slot columns of every request the worker holds,
updated from each step's deltas, and the vectorized pass that turns a step's
rows into model inputs.

Columns (host numpy, one row per slot): tokens [slots, width] (prompt plus
everything sampled), lengths (tokens known), num_pages and block_table
[slots, pages]. On CUDA a device copy of the block table is kept and patched
with each step's new entries only. Slots of removed requests are reused;
columns grow by doubling when a request or its table outgrows them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..attention import AttentionMetadata


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] on the device
    positions: torch.Tensor  # [T] on the device
    logits_indices: torch.Tensor  # [S] on the device: last token of each sampling row
    attention: AttentionMetadata
    input_ids_host: np.ndarray  # [T] (the dummy-null format samples from it); -1 where a token is not on the host yet
    logits_indices_host: np.ndarray  # [S]
    token_slots_host: np.ndarray  # [T] the slot (request) of each token
    positions_host: np.ndarray  # [T] int64: each token's position in its request


def _grown(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = np.zeros(shape, array.dtype)
    out[tuple(slice(0, n) for n in array.shape)] = array
    return out


class PersistentBatch:
    def __init__(self, block_size: int, device: torch.device):
        self.block_size = block_size
        self.device = device
        self.tokens = np.zeros((0, 0), np.int32)
        self.lengths = np.zeros(0, np.int64)
        self.num_pages = np.zeros(0, np.int64)
        self.block_table = np.zeros((0, 0), np.int64)
        self.free: list[int] = []
        self.on_cpu = device.type == "cpu"
        self.device_table: torch.Tensor | None = None  # CUDA only; None: resend in full
        self.pending: list[np.ndarray] = []  # CUDA: (slot, page, block) entries not yet on the device
        # CUDA: two pinned host buffers for the one copy per step, used in turn: a step's
        # copy may still be queued while the next step is built (overlapped steps),
        # never while the one after it is.
        self.staging: list[torch.Tensor | None] = [None, None]
        self.steps = 0

    # ------------------------------------------------------------ deltas

    def _reserve(self, slots: int, width: int, pages: int) -> None:
        cap, cur_width = self.tokens.shape
        cur_pages = self.block_table.shape[1]
        if slots > cap or width > cur_width or pages > cur_pages:
            new_cap = max(cap, 1)
            while new_cap < slots:
                new_cap *= 2
            new_width = max(cur_width, 16)
            while new_width < width:
                new_width *= 2
            new_pages = max(cur_pages, 4)
            while new_pages < pages:
                new_pages *= 2
            self.free += list(range(new_cap - 1, cap - 1, -1))
            self.tokens = _grown(self.tokens, (new_cap, new_width))
            self.lengths = _grown(self.lengths, (new_cap,))
            self.num_pages = _grown(self.num_pages, (new_cap,))
            self.block_table = _grown(self.block_table, (new_cap, new_pages))
            self.device_table = None

    def add(self, tokens: np.ndarray) -> int:
        if not self.free:
            self._reserve(self.tokens.shape[0] + 1, 0, 0)
        self._reserve(0, len(tokens) + 1, 0)
        slot = self.free.pop()
        self.tokens[slot, : len(tokens)] = tokens
        self.lengths[slot] = len(tokens)
        self.num_pages[slot] = 0
        return slot

    def remove(self, slot: int) -> None:
        self.lengths[slot] = 0
        self.num_pages[slot] = 0
        self.free.append(slot)

    def append_blocks(self, slots: np.ndarray, counts: np.ndarray, block_ids: np.ndarray) -> None:
        """Appends counts[i] ids of block_ids (in order) to the table of slots[i]."""
        if not len(block_ids):
            return
        owner = np.repeat(slots, counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        page = self.num_pages[owner] + np.arange(len(block_ids)) - first
        self._reserve(0, 0, int(page.max()) + 1)
        self.block_table[owner, page] = block_ids
        np.add.at(self.num_pages, slots, counts)
        if not self.on_cpu:
            self.pending.append(np.stack((owner, page, block_ids.astype(np.int64))))

    def append_tokens(self, slots: np.ndarray, tokens: np.ndarray) -> None:
        self._reserve(0, int(self.lengths[slots].max(initial=0)) + 2, 0)
        self.tokens[slots, self.lengths[slots]] = tokens
        self.lengths[slots] += 1

    def write_drafts(self, slots: np.ndarray, counts: np.ndarray, draft_ids: np.ndarray) -> None:
        """Speculative decoding: counts[i] ids of draft_ids (in order) written after
        the known tokens of slots[i], where the step's inputs read them; lengths
        stay (the drafts are not the request's tokens until verified)."""
        if not len(draft_ids):
            return
        ends = self.lengths[slots] + counts
        self._reserve(0, int(ends.max()) + 2, 0)
        owner = np.repeat(slots, counts)
        offset = np.arange(len(draft_ids)) - np.repeat(np.cumsum(counts) - counts, counts)
        self.tokens[owner, self.lengths[owner] + offset] = draft_ids

    def append_runs(self, slots: np.ndarray, counts: np.ndarray, tokens: np.ndarray) -> None:
        """Appends counts[i] tokens (in order) to slots[i] (distinct slots): append_tokens for several tokens a row."""
        if not len(slots):
            return
        self._reserve(0, int((self.lengths[slots] + counts).max()) + 2, 0)
        owner = np.repeat(slots, counts)
        offset = np.arange(len(tokens)) - np.repeat(np.cumsum(counts) - counts, counts)
        self.tokens[owner, self.lengths[owner] + offset] = tokens
        self.lengths[slots] += counts

    # ------------------------------------------------------------ inputs

    def inputs(self, slots: np.ndarray, start: np.ndarray, num_new: np.ndarray, sample: np.ndarray) -> StepInputs:
        """The step's model inputs, from int64 row columns (slot, first new position, new-token count, sample flag)."""
        bs = self.block_size
        n = len(slots)
        if n and num_new.min() == 1 and num_new.max() == 1:
            # Every row decodes one token (the common step): token i is row i.
            positions, token_slot, rows = start, slots, slots
            query_start = meta_start = np.arange(n + 1, dtype=np.int64)
            num_tokens = n
            seq_lens = start + 1
        else:
            query_start = np.zeros(n + 1, np.int64)
            np.cumsum(num_new, out=query_start[1:])
            num_tokens = int(query_start[-1])
            row_of_token = np.repeat(np.arange(n), num_new)
            positions = np.arange(num_tokens) + (start - query_start[:-1])[row_of_token]
            token_slot = slots[row_of_token]
            active = num_new > 0
            seq_lens = (start + num_new)[active]
            rows = slots[active]
            meta_start = np.zeros(len(rows) + 1, np.int64)
            np.cumsum(num_new[active], out=meta_start[1:])
        input_ids = self.tokens[token_slot, positions].astype(np.int64)
        slot_mapping = self.block_table[token_slot, positions // bs] * bs + positions % bs
        logits_indices = query_start[1:][sample] - 1
        pages = int(-(-seq_lens.max() // bs)) if len(rows) else 0
        # One int64 buffer, one (non-blocking) copy to the device.
        host = np.concatenate((input_ids, positions, slot_mapping, logits_indices, rows))
        if self.on_cpu:
            flat = torch.from_numpy(host)
            table = torch.from_numpy(self.block_table[rows, :pages])
        else:
            flat, table = self._to_device(host, rows, pages)
        t, s = num_tokens, len(logits_indices)
        meta = AttentionMetadata(flat[2 * t : 3 * t], meta_start, seq_lens, table, bs)
        return StepInputs(flat[:t], flat[t : 2 * t], flat[3 * t : 3 * t + s], meta, input_ids, logits_indices, token_slot, positions)

    def _to_device(self, host: np.ndarray, rows: np.ndarray, pages: int) -> tuple[torch.Tensor, torch.Tensor]:
        patch = np.concatenate(self.pending, axis=1).ravel() if self.pending and self.device_table is not None else np.zeros(0, np.int64)
        self.pending = []
        n = len(host) + len(patch)
        turn = self.steps % 2
        self.steps += 1
        if self.staging[turn] is None or self.staging[turn].numel() < n:
            self.staging[turn] = torch.empty(max(n, 4096) * 2, dtype=torch.int64).pin_memory()
        staged = self.staging[turn][:n]
        staged.numpy()[: len(host)] = host
        staged.numpy()[len(host) :] = patch
        flat = staged.to(self.device, non_blocking=True)
        if self.device_table is None:
            self.device_table = torch.from_numpy(self.block_table).to(self.device)
        elif len(patch):
            owner, page, block = flat[len(host) :].view(3, -1)
            self.device_table[owner, page] = block
        rows_dev = flat[len(host) - len(rows) : len(host)]
        return flat[: len(host)], self.device_table[rows_dev, :pages]
