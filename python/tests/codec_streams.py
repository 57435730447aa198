"""What the codec-node tests share (test_csm_codec_node.py, test_qwen3_omni_code2wav_node.py): a stream's
chunks as the conductor cuts a left_context policy, and streams driven through a codec node, a step's
chunks of all streams in one batch, as the worker runs them."""

from __future__ import annotations

import torch

from baton_worker.graph.node_runner import ChunkInfo, PassInfo


def left_context_chunks(n: int, size: int, left: int) -> list[tuple[ChunkInfo, int]]:
    """(ChunkInfo, item count) of every chunk of a stream that ended with n items, as chunk-policy.ts's
    nextChunk cuts a left_context policy: chunk k is [max(0, k*size - left), (k+1)*size); the first whose
    end passes n is final and holds [start, n) (remainder, only context, or nothing)."""
    chunks = []
    for k in range(n // size + 1):
        start, fresh, end = max(0, k * size - left), k * size, (k + 1) * size
        if end <= n:
            chunks.append((ChunkInfo(k, start, fresh - start, False), end - start))
        else:
            chunks.append((ChunkInfo(k, start, fresh - start, True), n - start))
            break
    return chunks


def stream_through(node, walk: str, streams: dict[str, torch.Tensor], size: int, left: int,
                   calls: list | None = None, frame_samples: int = 1) -> tuple[dict[str, list[torch.Tensor]], int]:
    """Every stream's chunks through `node` (request name -> its PCM pieces) and the number of forwards. The
    order of requests within a batch varies by step; the "mid" stream's items come as one tensor of several
    frames. With `calls` (the codec's decode_windows calls, recorded by the caller), every forward makes at
    most one call. Every emitted piece is float32, non-empty and a multiple of frame_samples."""
    chunks = {r: left_context_chunks(len(s), size, left) for r, s in streams.items()}
    pcm: dict[str, list[torch.Tensor]] = {r: [] for r in streams}
    forwards = 0
    for step in range(max(len(c) for c in chunks.values())):
        live = [r for r in streams if step < len(chunks[r])]
        live = live[step % 2 :] + live[: step % 2]
        infos, prepared = [], []
        for rid, r in enumerate(live):
            info, count = chunks[r][step]
            items = list(streams[r][info.start : info.start + count])  # one tensor of codes per item
            if r == "mid":
                items = [streams[r][info.start : info.start + count]]  # several frames in one tensor
            infos.append(PassInfo(step * 100 + rid, rid, walk, "codec", {node.input_name: info}, {}, {}))
            prepared.append(node.prepare_inputs(walk, infos[-1], {node.input_name: items}))
        before = 0 if calls is None else len(calls)
        outputs = node(walk, infos, node.preprocess(walk, infos, prepared))
        forwards += 1
        if calls is not None:
            assert len(calls) - before <= 1, "every pass of a batch goes through one decode_windows call"
        assert len(outputs) == len(live)
        for r, out in zip(live, outputs, strict=True):
            assert set(out) == {node.output_name}
            for p in out[node.output_name]:
                assert p.dtype == torch.float32 and p.dim() == 1 and p.numel() > 0 and p.numel() % frame_samples == 0
            pcm[r] += out[node.output_name]
    return pcm, forwards
