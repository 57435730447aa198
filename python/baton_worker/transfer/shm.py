"""Tensors between workers on one host through shared memory.

A producing worker owns one arena: a file in /dev/shm (POSIX shared memory on
Linux) that it maps once and carves into blocks. `put` copies a tensor into a
block and returns a `ShmRef`, the descriptor that travels on the control plane
(segment name, offset, byte count, dtype, shape); a consuming worker maps the
segment once (read-only) and copies the bytes out. The consumer's pass
completing is the acknowledgement: the conductor then tells the producer to
`free` the block. The bytes never pass through TypeScript.

The arena's size is the producer's share of one host-wide budget, given by the
code that starts the workers (M* applied its limit per process, so the host's
/dev/shm use grew with the worker count). A tensor that does not fit raises
`ShmFull`, which fails the request that produced it, not the worker.

Files are named `baton-<pid>-<tag>`: the supervisor that started the worker
removes what a dead worker left (`remove_segments_of`).
"""

from __future__ import annotations

import bisect
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import torch

SHM_DIR = Path("/dev/shm")
ALIGN = 64  # cache-line aligned blocks; torch.frombuffer needs element alignment at least


class ShmFull(Exception):
    """The arena has no free block large enough for a tensor."""


@dataclass(frozen=True)
class ShmRef:
    segment: str  # file name under /dev/shm
    offset: int
    nbytes: int
    dtype: str  # torch dtype name without the "torch." prefix
    shape: tuple[int, ...]


def segment_name(pid: int, tag: str) -> str:
    return f"baton-{pid}-{tag}"


def remove_segments_of(pid: int) -> list[str]:
    """Unlinks every segment a (dead) worker process left; returns their names."""
    removed = []
    for path in SHM_DIR.glob(f"baton-{pid}-*"):
        try:
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:
            pass
    return removed


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


class ShmArena:
    """The producer's side: one shared segment, first-fit blocks, coalescing frees."""

    def __init__(self, size: int, tag: str = "arena"):
        if size <= 0:
            raise ValueError("the arena size must be positive")
        self.size = -(-size // ALIGN) * ALIGN
        self.name = segment_name(os.getpid(), tag)
        path = SHM_DIR / self.name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self.size)
            self._map = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self._view = torch.frombuffer(self._map, dtype=torch.uint8)
        # Free blocks as sorted (offset, length) lists; live blocks by offset.
        self._free_offsets = [0]
        self._free_lengths = [self.size]
        self._live: dict[int, int] = {}

    @property
    def used_bytes(self) -> int:
        return sum(self._live.values())

    @property
    def live_blocks(self) -> int:
        return len(self._live)

    def put(self, tensor: torch.Tensor) -> ShmRef:
        data = tensor.detach().contiguous()
        if data.device.type != "cpu":
            data = data.cpu()
        nbytes = data.numel() * data.element_size()
        length = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        offset = self._allocate(length, nbytes)
        if nbytes:
            self._view[offset : offset + nbytes].copy_(data.reshape(-1).view(torch.uint8))
        return ShmRef(self.name, offset, nbytes, str(data.dtype).removeprefix("torch."), tuple(data.shape))

    def free(self, ref: ShmRef) -> None:
        if ref.segment != self.name:
            raise ValueError(f"{ref.segment} is not this arena ({self.name})")
        length = self._live.pop(ref.offset, None)
        if length is None:
            return  # freeing twice is harmless: a duplicate release
        i = bisect.bisect(self._free_offsets, ref.offset)
        self._free_offsets.insert(i, ref.offset)
        self._free_lengths.insert(i, length)
        # Coalesce with the next, then the previous free block.
        if i + 1 < len(self._free_offsets) and self._free_offsets[i] + self._free_lengths[i] == self._free_offsets[i + 1]:
            self._free_lengths[i] += self._free_lengths.pop(i + 1)
            self._free_offsets.pop(i + 1)
        if i > 0 and self._free_offsets[i - 1] + self._free_lengths[i - 1] == self._free_offsets[i]:
            self._free_lengths[i - 1] += self._free_lengths.pop(i)
            self._free_offsets.pop(i)

    def _allocate(self, length: int, nbytes: int) -> int:
        for i, free in enumerate(self._free_lengths):
            if free >= length:
                offset = self._free_offsets[i]
                if free == length:
                    self._free_offsets.pop(i)
                    self._free_lengths.pop(i)
                else:
                    self._free_offsets[i] += length
                    self._free_lengths[i] -= length
                self._live[offset] = length
                return offset
        raise ShmFull(
            f"shared-memory arena {self.name} has no room for {nbytes} bytes "
            f"({self.used_bytes} of {self.size} bytes in use); raise baton serve --shm-bytes"
        )

    def close(self) -> None:
        """Unmaps and unlinks the segment; readers that still map it keep their mapping."""
        if self._map is None:
            return
        del self._view
        self._map.close()
        self._map = None
        try:
            (SHM_DIR / self.name).unlink()
        except FileNotFoundError:
            pass


class ShmReader:
    """The consumer's side: maps each producer's segment once, copies tensors out."""

    def __init__(self):
        self._maps: dict[str, mmap.mmap] = {}

    def read(self, ref: ShmRef, device: torch.device | str = "cpu") -> torch.Tensor:
        dtype = _dtype(ref.dtype)
        if ref.nbytes == 0:
            return torch.empty(ref.shape, dtype=dtype, device=device)
        mapped = self._maps.get(ref.segment)
        if mapped is None:
            try:
                fd = os.open(SHM_DIR / ref.segment, os.O_RDONLY)
            except FileNotFoundError:
                raise FileNotFoundError(f"shared-memory segment {ref.segment} is gone (its worker exited)") from None
            try:
                mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            self._maps[ref.segment] = mapped
        if ref.offset + ref.nbytes > len(mapped):
            raise ValueError(f"{ref.segment}: bytes [{ref.offset}, {ref.offset + ref.nbytes}) are outside the segment")
        raw = memoryview(mapped)[ref.offset : ref.offset + ref.nbytes]
        # The copy detaches the tensor from the producer's block before it is freed.
        tensor = torch.frombuffer(bytearray(raw), dtype=dtype).reshape(ref.shape)
        raw.release()
        return tensor.to(device) if torch.device(device).type != "cpu" else tensor

    def forget(self, segment: str) -> None:
        mapped = self._maps.pop(segment, None)
        if mapped is not None:
            mapped.close()

    def close(self) -> None:
        for segment in list(self._maps):
            self.forget(segment)
