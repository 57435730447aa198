"""Qwen3-Omni's code2wav node (baton_worker.models.qwen3_omni.code2wav_node) against transformers' code2wav
on the tiny random directory (float32, CPU):

- streams of random frames for several requests, of different lengths (shorter than a chunk, past the
  left context, capped without a stop frame, nothing but the stop frame), are cut into chunks exactly as
  the conductor cuts a LeftContextChunkPolicy stream (src/graph/chunk-policy.ts), the passes of different
  requests batched into each forward (one decode_windows call each); every request's concatenated PCM is
  transformers' Qwen3OmniMoeCode2Wav forward of all its frames before the stop frame (a whole-sequence
  decode, not its chunked_decode), to 1e-5 and one 16-bit step; each chunk brings C frames' samples (the
  first 555 fewer); the stop frame's and any later item's codes are never decoded;
- the talker's speech for a chat, streamed from generate's codes and the stop frame, is generate's audio;
- the policy is the whole receptive field (capped on request); a final chunk with no new frame emits
  nothing; bad items fail their pass."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_omni_moe")

from baton_worker.graph.node_runner import ChunkInfo, PassInfo  # noqa: E402
from baton_worker.graph.streaming import LeftContextChunkPolicy  # noqa: E402
from baton_worker.models.qwen3_omni import build  # noqa: E402
from baton_worker.models.qwen3_omni.code2wav_node import DEFAULT_CHUNK_FRAMES, INPUT, OUTPUT, code2wav_chunk_policy, load_code2wav_node  # noqa: E402
from codec_streams import stream_through  # noqa: E402
from qwen3_omni_fixtures import OMNI_MARKS, hf, model_dir, processor  # noqa: E402,F401  (fixtures)

pytestmark = OMNI_MARKS

G = build.NUM_CODE_GROUPS
EOS = build.CODEC_EOS_ID
WALK = "code2wav_chunk"


@pytest.fixture(scope="module")
def node(model_dir):
    return load_code2wav_node(model_dir, "cpu")


def s16(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x.clamp(-1, 1) * 32767)


def test_streamed_batches_match_the_whole_decode(node, hf):
    code2wav = node.codec
    fs = code2wav.frame_samples
    size, left = code2wav_chunk_policy(code2wav)
    LeftContextChunkPolicy(size, left)  # valid parameters for the graph's connection
    assert (size, left) == (DEFAULT_CHUNK_FRAMES, code2wav.left_context_frames) and left == 81  # 1 layer of window 72, 10 for the convs

    g = torch.Generator().manual_seed(7)

    def frames(count: int) -> torch.Tensor:
        return torch.randint(0, code2wav.codebook_size, (count, G), generator=g)

    stop = torch.full((1, G), EOS)
    streams = {
        "short": torch.cat([frames(3), stop]),  # shorter than a chunk: the stop frame is in the only chunk
        "mid": torch.cat([frames(37), stop]),
        "steady": torch.cat([frames(110), stop]),  # past the left context: windows of left + size frames
        "steady2": torch.cat([frames(103), stop]),
        "capped": frames(24),  # stopped by max tokens: no stop frame, the final chunk only context
        "silent": stop,  # no audio frame at all
    }
    # Past the stop frame nothing is decoded, whatever it holds (not even codes outside the codebook).
    streams["mid"] = torch.cat([streams["mid"], torch.full((2, G), 10**6)])

    calls: list[list[tuple[int, ...]]] = []
    inner = code2wav.decode_windows

    def counting(windows, num_new):
        calls.append([tuple(w.shape) for w in windows])
        return inner(windows, num_new)

    code2wav.decode_windows = counting
    try:
        pcm, _ = stream_through(node, WALK, streams, size, left, calls)
    finally:
        code2wav.decode_windows = inner
    assert any(shape.count((G, left + size)) >= 2 for shape in calls), "steady windows of two requests batch together"
    assert any(len({s[1] for s in shapes}) > 1 for shapes in calls), "windows of different lengths batch together"

    assert pcm["silent"] == []
    for r, codes in streams.items():
        if r == "silent":
            continue
        stops = (codes[:, 0] == EOS).nonzero()
        n = int(stops[0, 0]) if stops.numel() else len(codes)
        assert n == {"short": 3, "mid": 37, "steady": 110, "steady2": 103, "capped": 24}[r]
        with torch.no_grad():
            whole = hf.code2wav(codes[:n].T[None])[0, 0]
        assert torch.equal(code2wav(codes[:n].T[None])[0, 0], whole)
        # A chunk adds its new frames' samples; the stream's first chunk the first frame's 555 fewer.
        sizes = [p.numel() for p in pcm[r]]
        assert sizes[0] == min(size, n) * fs - code2wav.dropped_samples and all(s % fs == 0 for s in sizes[1:])
        out = torch.cat(pcm[r])
        assert out.shape == whole.shape == (n * fs - code2wav.dropped_samples,)
        torch.testing.assert_close(out, whole, rtol=0, atol=1e-5)
        assert (s16(out) - s16(whole)).abs().max() <= 1, r
    assert s16(torch.cat(pcm["steady"])).abs().max() > 1000, "random weights give audible PCM"


def test_streamed_talker_speech_is_generates_audio(node, hf, processor):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Count to three."}]}]
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt")
    seen = {}
    inner = hf.code2wav.chunked_decode

    def recording(codes, *args, **kwargs):
        seen["codes"] = codes[0].T.clone()  # [frames, G]
        return inner(codes, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf.code2wav, "chunked_decode", recording)
        with torch.no_grad():
            _, audio = hf.generate(**inputs, return_audio=True, speaker="Ethan", thinker_do_sample=False, talker_do_sample=False,
                                   thinker_max_new_tokens=10, talker_max_new_tokens=40)
    codes = seen["codes"]
    assert codes.shape == (9, G)
    # The talker node's stream: every frame, then the stop frame (talker_steps.py); chunks of 4 for several passes.
    stream = torch.cat([codes, torch.full((1, G), EOS)])
    pcm = torch.cat(stream_through(node, WALK, {"speech": stream}, 4, node.codec.left_context_frames)[0]["speech"])
    expected = audio.reshape(-1)
    assert pcm.shape == expected.shape
    torch.testing.assert_close(pcm, expected, rtol=0, atol=1e-5)


def test_policy_final_chunks_and_bad_items(node, model_dir):
    code2wav = node.codec
    config = json.loads((model_dir / "config.json").read_text())
    assert code2wav_chunk_policy(config) == (DEFAULT_CHUNK_FRAMES, code2wav.left_context_frames)
    assert code2wav_chunk_policy({}) == (DEFAULT_CHUNK_FRAMES, 578)  # Qwen3-Omni's code2wav: 46 s
    assert code2wav_chunk_policy(code2wav, chunk=2, max_left_context=30) == (2, 30)
    assert code2wav_chunk_policy(code2wav, max_left_context=1000) == (DEFAULT_CHUNK_FRAMES, code2wav.left_context_frames)
    with pytest.raises(ValueError, match="chunk"):
        code2wav_chunk_policy(code2wav, chunk=0)

    frames = torch.randint(0, code2wav.codebook_size, (12, G), generator=torch.Generator().manual_seed(1))
    # A final chunk with context only, one with nothing at all, one that starts with the stop frame: no audio.
    for info, items in ((ChunkInfo(2, 4, 8, True), list(frames[4:12])), (ChunkInfo(0, 0, 0, True), []),
                        (ChunkInfo(1, 0, 4, True), [*frames[:4], torch.full((G,), EOS)])):
        p = PassInfo(1, 1, WALK, "code2wav", {INPUT: info}, {}, {})
        assert node(WALK, [p], [node.prepare_inputs(WALK, p, {INPUT: items})]) == [{OUTPUT: []}]
    # A final short chunk: its one new frame's samples.
    p = PassInfo(1, 1, WALK, "code2wav", {INPUT: ChunkInfo(1, 0, 8, True)}, {}, {})
    (out,) = node(WALK, [p], [node.prepare_inputs(WALK, p, {INPUT: list(frames[:9])})])
    assert out[OUTPUT][0].numel() == code2wav.frame_samples

    info = PassInfo(1, 1, WALK, "code2wav", {INPUT: ChunkInfo(0, 0, 0, False)}, {}, {})
    bad = frames[0].clone()
    bad[2] = code2wav.codebook_size  # a code group 2 cannot have
    with pytest.raises(ValueError, match=rf"frame 1, group 2: code {code2wav.codebook_size}"):
        node.prepare_inputs(WALK, info, {INPUT: [frames[0], bad]})
    with pytest.raises(ValueError, match="integer codes per frame"):
        node.prepare_inputs(WALK, info, {INPUT: [frames[0][:3]]})
    with pytest.raises(ValueError, match="integer codes per frame"):
        node.prepare_inputs(WALK, info, {INPUT: [frames[0].float()]})
    with pytest.raises(ValueError, match="holds 1 frames but 4 of context"):
        node.prepare_inputs(WALK, PassInfo(1, 1, WALK, "code2wav", {INPUT: ChunkInfo(1, 0, 4, False)}, {}, {}), {INPUT: [frames[0]]})
