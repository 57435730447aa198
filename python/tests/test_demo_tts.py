"""The demo TTS model: builder, tokenizer files, codec, window arithmetic, prompt and audio bytes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from baton_worker.model.config import load_model_config
from baton_worker.models.demo_tts.audio import pcm_to_s16le, s16le_to_array
from baton_worker.models.demo_tts.build import build
from baton_worker.models.demo_tts.codec import CodecDecoder, load_codec
from baton_worker.models.demo_tts.spec import DemoTTSSpec, TokenLayout
from baton_worker.models.demo_tts.streaming import StreamChunk, chunk_frames, load_codec_stream, sliding_window_chunks
from baton_worker.models.demo_tts.text import prompt_ids, prompt_tensors, tokenizer_json

SPEC = DemoTTSSpec()
T = SPEC.tokens
F = SPEC.tokens_per_frame
SPF = SPEC.codec.samples_per_frame


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build(tmp_path_factory.mktemp("demo-tts"))


@pytest.fixture(scope="module")
def codec_stream(model_dir):
    return load_codec_stream(model_dir)


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_builder_is_deterministic_and_leaves_an_up_to_date_dir_alone(model_dir, tmp_path):
    again = build(tmp_path / "again")
    first = _files(model_dir)
    assert set(first) == {
        "config.json",
        "codec.safetensors",
        "llm/config.json",
        "llm/generation_config.json",
        "llm/model.safetensors",
        "llm/tokenizer.json",
        "llm/tokenizer_config.json",
    }
    assert _files(again) == first
    mtimes = {p: p.stat().st_mtime_ns for p in again.rglob("*") if p.is_file()}
    build(again)
    assert {p: p.stat().st_mtime_ns for p in again.rglob("*") if p.is_file()} == mtimes


def test_config_describes_the_model(model_dir):
    raw = json.loads((model_dir / "config.json").read_text())
    assert raw["architectures"] == ["BatonDemoTTS"]
    assert raw["llm"] == "llm"
    assert raw["sample_rate"] == 24000
    assert raw["stream"] == {"policy": "sliding_window", "window_tokens": 16, "stride_tokens": 4}
    assert raw["codec"]["samples_per_frame"] == 480
    assert DemoTTSSpec.from_dir(model_dir) == SPEC


def test_spec_refuses_windows_off_frame_boundaries():
    from baton_worker.models.demo_tts.spec import StreamSpec

    with pytest.raises(ValueError, match="stride exactly one frame"):
        DemoTTSSpec(stream=StreamSpec(window_tokens=16, stride_tokens=8))
    with pytest.raises(ValueError, match="multiple of a frame"):
        DemoTTSSpec(stream=StreamSpec(window_tokens=18, stride_tokens=4))


def test_transformers_loads_the_llm_dir(model_dir):
    from transformers import AutoTokenizer, GenerationConfig, LlamaForCausalLM

    llm = LlamaForCausalLM.from_pretrained(model_dir / "llm")
    assert llm.config.vocab_size == T.vocab_size == 585
    assert sum(p.numel() for p in llm.parameters()) < 4_000_000
    assert GenerationConfig.from_pretrained(model_dir / "llm").eos_token_id == T.end_of_audio
    logits = llm(torch.tensor([prompt_ids("hi", "echo", T)])).logits
    assert logits.shape == (1, 5, 585)
    tok = AutoTokenizer.from_pretrained(model_dir / "llm")
    assert tok.eos_token_id == T.end_of_audio and tok.bos_token_id == T.bos


def test_baton_worker_reads_the_llm_dir(model_dir):
    config = load_model_config(model_dir / "llm")
    assert (config.architecture, config.vocab_size, config.num_layers) == ("LlamaForCausalLM", 585, 4)
    assert config.eos_token_ids == [T.end_of_audio]


def test_tokenizer_json_is_what_the_tokenizers_package_writes(model_dir):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from baton_worker.models.demo_tts.text import byte_symbols, special_tokens

    reference = Tokenizer(models.BPE(vocab={s: b for b, s in enumerate(byte_symbols())}, merges=[]))
    reference.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    reference.decoder = decoders.ByteLevel()
    reference.add_special_tokens([AddedToken(content, special=True, normalized=False) for _, content in special_tokens(T)])
    assert json.loads(reference.to_str()) == tokenizer_json(T)

    tok = Tokenizer.from_file(str(model_dir / "llm" / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == T.vocab_size
    text = "Héllo, wörld! 你好 <|bos|>"
    # The file encodes text as the worker does (UTF-8 bytes) as long as no special-token string appears in it.
    assert tok.encode(text[:-8], add_special_tokens=False).ids == list(text[:-8].encode())
    assert tok.decode(list(text.encode())) == text
    assert tok.id_to_token(T.voice_id("shimmer")) == "<|voice:shimmer|>"
    assert tok.id_to_token(T.audio_token(3, 79)) == "<|audio:3:79|>" and T.audio_token(3, 79) == T.vocab_size - 1


def test_prompt_is_bos_voice_text_start_of_speech():
    assert prompt_ids("Hi é", "nova", T) == [T.bos, T.voice_id("nova"), 72, 105, 32, 0xC3, 0xA9, T.start_of_speech]
    assert prompt_ids("", None, T) == [T.bos, T.voice_id("alloy"), T.start_of_speech]
    assert prompt_ids("<|bos|>", "Onyx", T)[2:-1] == list(b"<|bos|>")
    (ids,) = prompt_tensors("ok", "fable", T)["text_inputs"]
    assert ids.dtype == torch.int64 and ids.tolist() == [T.bos, T.voice_id("fable"), 111, 107, T.start_of_speech]
    assert [T.voice_id(v) for v in ("alloy", "echo", "fable", "onyx", "nova", "shimmer")] == list(range(259, 265))


def test_unknown_voice_names_it_and_the_valid_ones():
    with pytest.raises(ValueError) as err:
        prompt_ids("hello", "darth", T)
    message = str(err.value)
    assert "'darth'" in message
    assert "alloy, echo, fable, onyx, nova, shimmer" in message


def test_postprocess_bytes_are_clamped_rounded_s16le():
    pcm = torch.tensor([0.0, 1.0, -1.0, 2.0, -3.0, 0.5, -0.5, 1.5 / 32767, 2.5 / 32767, 1e-6])
    data = pcm_to_s16le(pcm)
    assert len(data) == 2 * pcm.numel()
    # 0.5 * 32767 = 16383.5 and 1.5, 2.5 round half to even (torch.round).
    assert s16le_to_array(data).tolist() == [0, 32767, -32767, 32767, -32767, 16384, -16384, 2, 2, 0]
    assert data[2:4] == b"\xff\x7f"  # little-endian
    assert pcm_to_s16le(torch.zeros(0)) == b""


def test_codec_decodes_frames_to_pcm_batched(model_dir):
    decoder = load_codec_stream(model_dir).decoder
    assert isinstance(decoder, CodecDecoder)
    codes = torch.randint(0, T.codebook_size, (5, 7, F), generator=torch.Generator().manual_seed(1))
    pcm = decoder(codes)
    assert pcm.shape == (5, 7 * SPF) and pcm.dtype == torch.float32
    assert pcm.abs().max() <= 1.0 and 0.05 < pcm.std() < 0.6  # audible, not clipped
    # Batch-invariant to the bit: a row's PCM does not depend on its batch.
    for row in range(5):
        assert torch.equal(decoder(codes[row : row + 1])[0], pcm[row])
    assert decoder(codes[:, :1]).shape == (5, SPF)
    with pytest.raises(ValueError, match="codes per frame"):
        decoder(codes[:, :, :3])


def test_codec_weights_are_float32_on_disk_and_load_again(model_dir):
    from safetensors.torch import load_file

    weights = load_file(str(model_dir / "codec.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.float32}
    assert sum(t.numel() for t in weights.values()) < 1_000_000
    load_codec(SPEC.codec, weights)


# ---- window arithmetic ----------------------------------------------------------------

W, S = SPEC.stream.window_tokens, SPEC.stream.stride_tokens
COUNTS = sorted({0, 1, F - 1, F, F + 1, W - 1, W, W + 1, W + S, 2 * W, 2 * W + 3, 5 * F + 2, 40, 41, 43})


@pytest.mark.parametrize("n", COUNTS)
def test_sliding_window_chunks_one_final_last_offsets_and_context(n):
    chunks = sliding_window_chunks(n, W, S)
    assert [c.final for c, _ in chunks] == [False] * (len(chunks) - 1) + [True]
    assert [c.index for c, _ in chunks] == list(range(len(chunks)))
    seen = 0  # items [0, seen) were in earlier chunks
    for chunk, length in chunks:
        assert chunk.start + chunk.context_count == seen
        assert chunk.context_count == min(length, max(0, seen - chunk.start))
        assert chunk.start + length <= n
        if not chunk.final:
            assert length == W
        seen = max(seen, chunk.start + length)
    assert seen == n  # every item in some chunk
    final, length = chunks[-1]
    assert length - final.context_count < S or n < W  # after a full window the final chunk completes no frame


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("stopped", [False, True], ids=["cap", "end-of-audio"])
def test_every_audio_frame_is_emitted_once_in_order(n, stopped):
    items = n + 1 if stopped else n  # end-of-audio, when it stops the loop, is the stream's last item
    emitted = []
    for chunk, length in sliding_window_chunks(items, W, S):
        audio = min(length, n - chunk.start) if stopped else length
        span = chunk_frames(chunk, max(audio, 0), F)
        if span.new_count:  # the emitted frames are the decoded window's last ones
            assert span.first <= span.first_new and span.first_new + span.new_count == span.first + span.count
        emitted += range(span.first_new, span.first_new + span.new_count)
    assert emitted == list(range(n // F))


def test_chunk_frames_examples():
    # First full window: 4 frames decoded, all new.
    span = chunk_frames(StreamChunk(0, 0, 0, False), 16, 4)
    assert (span.first, span.count, span.first_new, span.new_count) == (0, 4, 0, 4)
    # Window 3 = items [12, 28): frames 3..6 decoded, frame 6 new.
    span = chunk_frames(StreamChunk(3, 12, 12, False), 16, 4)
    assert (span.first, span.count, span.first_new, span.new_count) == (3, 4, 6, 1)
    # Final tail [16, 30) after the window at 12: 12 context + 2 new items, frame 7 incomplete.
    span = chunk_frames(StreamChunk(4, 16, 12, True), 14, 4)
    assert (span.first, span.count, span.new_count) == (4, 3, 0)
    # Short stream (10 items < window): [0, 10), frames 0 and 1.
    span = chunk_frames(StreamChunk(0, 0, 0, True), 10, 4)
    assert (span.first, span.count, span.first_new, span.new_count) == (0, 2, 0, 2)
    # Empty final chunk.
    span = chunk_frames(StreamChunk(5, 20, 0, True), 0, 4)
    assert span.count == 0 and span.new_count == 0


def _stream_pcm(codec_stream, tokens, final_tail=True):
    """Runs the codec over the policy's chunks; final_tail=False sends the final chunk empty instead."""
    items = torch.tensor(tokens, dtype=torch.int64)
    out = []
    for chunk, length in sliding_window_chunks(len(tokens), W, S):
        if chunk.final and not final_tail and chunk.index > 0:
            chunk, length = StreamChunk(chunk.index, len(tokens), 0, True), 0
        (pcm,) = codec_stream([items[chunk.start : chunk.start + length]], [chunk])
        out.append(pcm)
    return out


def test_stream_pcm_is_frames_decoded_in_their_windows(codec_stream):
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, T.vocab_size, 43).tolist()
    tokens = [t if t != T.end_of_audio else 0 for t in tokens]
    pcm = _stream_pcm(codec_stream, tokens)
    assert [p.numel() // SPF for p in pcm] == [4] + [1] * 6 + [0]  # 43 items: 10 frames
    codes = codec_stream.codes_of(torch.tensor(tokens[:40])).reshape(10, F)
    decoder = codec_stream.decoder
    assert torch.equal(pcm[0], decoder(codes[None, 0:4])[0])
    for i in range(1, 7):  # frame i+3 is the last frame of window i, frames i..i+3
        assert torch.equal(pcm[i], decoder(codes[None, i : i + 4])[0, 3 * SPF :])


def test_non_audio_tokens_map_to_codes_by_modulo(codec_stream):
    tokens = torch.tensor([T.audio_token(2, 7), 7 - 80 + T.audio_offset, 0, T.bos])
    assert codec_stream.codes_of(tokens).tolist() == [7, 7, (0 - T.audio_offset) % 80, (T.bos - T.audio_offset) % 80]


def test_end_of_audio_in_the_stream_or_not_and_an_empty_final_chunk_give_the_same_bytes(codec_stream):
    rng = np.random.default_rng(5)
    for n in (0, 3, 15, 16, 17, 20, 33):
        tokens = [int(t) for t in rng.integers(T.audio_offset, T.vocab_size, n)]
        plain = b"".join(pcm_to_s16le(p) for p in _stream_pcm(codec_stream, tokens))
        assert len(plain) == (n // F) * SPF * 2
        assert b"".join(pcm_to_s16le(p) for p in _stream_pcm(codec_stream, tokens + [T.end_of_audio])) == plain
        assert b"".join(pcm_to_s16le(p) for p in _stream_pcm(codec_stream, tokens, final_tail=False)) == plain


def test_a_batch_of_chunks_from_many_requests_equals_each_alone(codec_stream):
    rng = np.random.default_rng(9)
    streams = [rng.integers(0, T.vocab_size - 1, n).tolist() for n in (16, 25, 9, 40)]
    batch_items, batch_chunks, alone = [], [], []
    for tokens in streams:
        items = torch.tensor(tokens)
        for chunk, length in sliding_window_chunks(len(tokens), W, S):
            batch_items.append(items[chunk.start : chunk.start + length])
            batch_chunks.append(chunk)
            alone.append(codec_stream([batch_items[-1]], [chunk])[0])
    together = codec_stream(batch_items, batch_chunks)
    assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True))


def test_token_layout_has_no_gaps():
    layout = TokenLayout()
    assert layout.vocab_size == 585
    assert layout.audio_token(0, 0) == layout.audio_offset == layout.first_voice + len(layout.voices)
