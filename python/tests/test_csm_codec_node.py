"""CSM's codec node (baton_worker.models.csm.codec_node) against transformers' decode of whole requests.

Random frames for several requests are cut into chunks exactly as the
TypeScript conductor cuts a LeftContextChunkPolicy stream (src/graph/chunk-policy.ts),
the passes of different requests are batched together into each forward, and
every request's concatenated PCM is compared with transformers'
codec_model.decode of all its frames up to the first all-eos one (generate's
cutoff): each s16 sample within 1 and the float PCM within 1e-5 (transformers'
own prefix decode already differs from its whole decode by ~7e-7, 1 LSB in places).
"""

from __future__ import annotations

import json

import pytest
import torch
from codec_streams import left_context_chunks, stream_through
from csm_fixtures import CSM_MARKS, hf, model_dir  # noqa: F401  (fixtures)

transformers = pytest.importorskip("transformers")

from baton_worker.graph.node_runner import ChunkInfo, PassInfo  # noqa: E402
from baton_worker.graph.streaming import LeftContextChunkPolicy  # noqa: E402
from baton_worker.models.csm.codec_node import DEFAULT_CHUNK_FRAMES, INPUT, OUTPUT, codec_chunk_policy, load_codec_node  # noqa: E402

pytestmark = CSM_MARKS

EOS = 0
WALK = "codec_chunk"


@pytest.fixture(scope="module")
def node(model_dir):
    return load_codec_node(model_dir, "cpu")


def test_chunking_mirrors_the_conductor():
    assert left_context_chunks(0, 4, 6) == [(ChunkInfo(0, 0, 0, True), 0)]
    assert left_context_chunks(8, 4, 6) == [
        (ChunkInfo(0, 0, 0, False), 4),
        (ChunkInfo(1, 0, 4, False), 8),
        (ChunkInfo(2, 2, 6, True), 6),  # only context: n is a multiple of size
    ]
    assert left_context_chunks(14, 4, 6)[-1] == (ChunkInfo(3, 6, 6, True), 8)


def transformers_cutoff(codes: torch.Tensor) -> int:
    """The frames generate decodes: up to its first all-eos frame (generation_csm.py)."""
    stops = (codes == EOS).all(dim=-1).nonzero()
    return int(stops.min()) if stops.numel() else codes.shape[0]


def s16(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x.clamp(-1, 1) * 32767)


def test_streamed_batches_match_transformers_whole_decode(node, hf):
    decoder = node.codec
    k, fs = decoder.num_codebooks, decoder.frame_samples
    size, left = codec_chunk_policy(decoder)
    LeftContextChunkPolicy(size, left)  # valid parameters for the graph's connection
    assert (size, left) == (DEFAULT_CHUNK_FRAMES, decoder.left_context_frames) and left == 130

    g = torch.Generator().manual_seed(7)
    stop = torch.full((1, k), EOS)

    def frames(count: int) -> torch.Tensor:
        return torch.randint(0, decoder.codebook_size, (count, k), generator=g)

    partial = frames(17)
    partial[-1, :-1] = EOS  # codebooks 0..K-2 eos: generate stops there but still decodes it (not all eos)
    streams = {
        "short": torch.cat([frames(3), stop]),  # shorter than a chunk: the stop frame is in the only chunk
        "mid": torch.cat([frames(17), stop]),
        "long": torch.cat([frames(45), stop]),
        "steady": torch.cat([frames(157), stop]),  # past left_context: windows of left + size frames
        "steady2": torch.cat([frames(150), stop]),
        "capped": frames(12),  # stopped by the frame cap: no stop frame, final chunk only context
        "partial_stop": partial,
        "silent": stop,  # no audio frame at all
    }
    # Count the decoder calls and keep their window shapes: one call per forward, equal windows batched.
    calls: list[list[tuple[int, ...]]] = []
    inner = decoder.decode_windows

    def counting(windows, num_new):
        calls.append([tuple(w.shape) for w in windows])
        return inner(windows, num_new)

    decoder.decode_windows = counting
    try:
        pcm, forwards = stream_through(node, WALK, streams, size, left, calls, fs)
    finally:
        decoder.decode_windows = inner
    assert len(calls) == forwards  # every step here emits some audio
    assert any(shape.count((k, left + size)) >= 2 for shape in calls), "steady windows of two requests batch together"

    assert pcm["silent"] == []
    diffs = {}
    for r, codes in streams.items():
        if r == "silent":
            continue
        cutoff = transformers_cutoff(codes)
        assert cutoff == len(codes) - (r not in ("capped", "partial_stop"))
        with torch.no_grad():
            ref = hf.codec_model.decode(codes[:cutoff].T[None]).audio_values[0, 0]
        out = torch.cat(pcm[r])
        assert out.shape == ref.shape == (cutoff * fs,)
        diffs[r] = ((out - ref).abs().max().item(), (s16(out) - s16(ref)).abs().max().item())
        assert diffs[r][0] < 1e-5 and diffs[r][1] <= 1, (r, diffs[r])
    assert s16(torch.cat(pcm["steady"])).abs().max() > 1000, "random weights give audible PCM"


def test_policy_cap_and_bad_codes(node, model_dir):
    decoder = node.codec
    assert codec_chunk_policy(decoder, max_left_context=64) == (DEFAULT_CHUNK_FRAMES, 64)
    assert codec_chunk_policy(json.loads((model_dir / "config.json").read_text())) == (DEFAULT_CHUNK_FRAMES, decoder.left_context_frames)
    assert codec_chunk_policy(transformers.CsmConfig().to_dict()) == (DEFAULT_CHUNK_FRAMES, 1001)  # sesame/csm-1b's codec
    assert codec_chunk_policy(decoder, chunk=2, max_left_context=1000) == (2, decoder.left_context_frames)
    with pytest.raises(ValueError, match="chunk"):
        codec_chunk_policy(decoder, chunk=0)

    info = PassInfo(1, 1, WALK, "codec", {INPUT: ChunkInfo(0, 0, 0, False)}, {}, {})
    bad = torch.ones(decoder.num_codebooks, dtype=torch.int64)
    bad[3] = decoder.codebook_size  # an id the backbone may have but Mimi cannot decode
    with pytest.raises(ValueError, match=rf"frame 1, codebook 3: code {decoder.codebook_size}"):
        node.prepare_inputs(WALK, info, {INPUT: [torch.ones_like(bad), bad]})
    with pytest.raises(ValueError, match="integer codes per frame"):
        node.prepare_inputs(WALK, info, {INPUT: [bad[:3]]})
    # A final empty chunk (n = 0 items) emits nothing.
    empty = PassInfo(2, 2, WALK, "codec", {INPUT: ChunkInfo(0, 0, 0, True)}, {}, {})
    assert node(WALK, [empty], [node.prepare_inputs(WALK, empty, {INPUT: []})]) == [{OUTPUT: []}]
