"""Grammar masks on the logits: the engine's packed token bitmasks (xgrammar's
layout, one bit per vocabulary id per constrained row) turned into -inf on
every token the grammar does not allow, before sampling.

The bits cross the seam packed (ceil(vocab / 32) int32 words per row) and are
unpacked where the logits live, so a GPU worker copies 4 KB per 32k tokens of
vocabulary per row, not a byte per token.
"""

from __future__ import annotations

import numpy as np
import torch

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def words_per_row(vocab: int) -> int:
    return -(-vocab // 32)


def unpack_bitmask(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """int32 [rows, words] -> bool [rows, vocab]: True where the token is allowed (on bits' device)."""
    shifts = _SHIFTS.get(bits.device)
    if shifts is None:
        shifts = _SHIFTS[bits.device] = torch.arange(32, dtype=torch.int32, device=bits.device)
    allowed = torch.bitwise_and(torch.bitwise_right_shift(bits.unsqueeze(-1), shifts), 1).to(torch.bool)
    return allowed.view(bits.shape[0], -1)[:, :vocab]


def banned_on_host(bitmask: np.ndarray, rows: int, vocab: int) -> np.ndarray:
    """The packed rows -> bool [rows, vocab], True where the token is not allowed.

    numpy's unpackbits reads bytes; in little-endian int32 words, bit j of word
    w is bit j % 8 of byte 4w + j // 8, so little bit order gives token order.
    """
    words = words_per_row(vocab)
    packed = np.ascontiguousarray(bitmask, dtype="<i4").reshape(rows, words)
    return np.unpackbits(~packed.view(np.uint8), axis=1, bitorder="little")[:, :vocab].view(np.bool_)


def apply_token_bitmask(logits: torch.Tensor, rows: np.ndarray, bitmask: np.ndarray) -> None:
    """Sets logits[rows[r], t] to -inf for every token t that row r's mask does not allow (in place).

    logits: [sampled rows, vocab]; rows: int indices into logits' rows; bitmask:
    int32, len(rows) * words_per_row(vocab) words, row after row.
    """
    if len(rows) == 0:
        return
    with torch.inference_mode():  # the logits are an inference tensor: updated in place only in this mode
        _apply(logits, rows, bitmask)


def _apply(logits: torch.Tensor, rows: np.ndarray, bitmask: np.ndarray) -> None:
    vocab = logits.shape[1]
    if logits.device.type == "cpu":
        # Unpacking bytes on the host is one numpy pass; torch's shift-and-mask would make a 32x larger int tensor.
        banned = torch.from_numpy(banned_on_host(bitmask, len(rows), vocab))
    else:
        bits = torch.from_numpy(np.ascontiguousarray(bitmask, dtype=np.int32).reshape(len(rows), words_per_row(vocab)))
        banned = ~unpack_bitmask(bits.to(logits.device, non_blocking=True), vocab)
    if len(rows) == logits.shape[0] and np.array_equal(rows, np.arange(len(rows))):
        logits.masked_fill_(banned, float("-inf"))
    else:
        index = torch.as_tensor(np.asarray(rows, dtype=np.int64), device=logits.device)
        logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(banned, float("-inf")))
