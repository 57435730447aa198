"""Qwen3-Omni's code2wav (baton_worker.models.qwen3_omni.code2wav) against transformers'
Qwen3OmniMoeCode2Wav, on a tiny random-weight module (the real 12.5 Hz -> 24 kHz
structure: ratios 2 x 2, rates 8 x 5 x 4 x 3; tiny widths, two layers, an
attention window shorter than the test sequences) read through `get` with the
full model's `code2wav.` names:

- the whole-sequence decode is the same bits as transformers', for sequences
  shorter and longer than the attention window;
- streaming: windows of 3, 5 and 7 new frames with left_context_frames of
  context concatenate to the whole decode (float32 rounding apart), also as
  16-bit PCM; a frame's samples depend on the code left_context_frames before
  it but not on any earlier one, nor on any later frame;
- batching: windows of several requests, of different lengths, in one call
  give each the samples it gets alone;
- the default config's receptive field; bad codes raise a ValueError naming them.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
qwen3_omni = pytest.importorskip("transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe")
qwen3_omni_config = pytest.importorskip("transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe")

from baton_worker.models.qwen3_omni.code2wav import Code2Wav, receptive_field  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRAMES = 40
TINY = dict(
    codebook_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
    num_hidden_layers=2, sliding_window=5, num_quantizers=4, decoder_dim=32,
)  # fmt: skip


def redraw(model: torch.nn.Module, seed: int) -> None:
    """Seeded weights of about unit gain, so the waveform is neither silent nor clipped."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=g)
            if name == "code_embedding.weight":
                p.copy_(r)
            elif p.dim() > 1:
                # The residual units' last convs smaller, so the three units of a block do not compound.
                p.copy_(r / p[0].numel() ** 0.5 * (0.3 if ".conv2." in name else 1))
            elif name.endswith("layer_scale.scale") or name.endswith(".gamma"):
                p.copy_(0.3 + 0.1 * r)
            elif "norm.weight" in name:
                p.copy_(1 + 0.2 * r)
            else:  # biases, SnakeBeta's alpha and beta (exponents)
                p.copy_(0.1 * r)
        # Speech-like levels (peaks well under 1): the final clamp must not hide differences.
        model.decoder[-1].conv.weight.mul_(0.3)


@pytest.fixture(scope="module")
def code2wav():
    """(transformers' Qwen3OmniMoeCode2Wav, its state dict under `code2wav.` names, our module in float32)."""
    config = qwen3_omni_config.Qwen3OmniMoeCode2WavConfig(**TINY)
    model = qwen3_omni.Qwen3OmniMoeCode2Wav(config).eval()
    redraw(model, 1)
    sd = {"code2wav." + k: v.detach().clone() for k, v in model.state_dict().items()}
    # Qwen3-Omni's config.json nests it; a saved config leaves out defaults (here the rates and the RoPE).
    saved = {k: v for k, v in config.to_dict().items() if k not in ("upsample_rates", "upsampling_ratios", "rope_parameters")}
    full_config = {"model_type": "qwen3_omni_moe", "code2wav_config": saved}
    return model, sd, full_config, Code2Wav(lambda n: sd[n], full_config)


def random_codes(decoder: Code2Wav, batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, decoder.codebook_size, (batch, decoder.num_quantizers, frames), generator=g)


def test_whole_decode_is_transformers_bits(code2wav):
    reference, _, _, decoder = code2wav
    assert (decoder.frame_samples, decoder.dropped_samples, decoder.frame_rate) == (1920, 555, 12.5)
    codes = random_codes(decoder, 2, FRAMES)
    out = decoder(codes)
    assert out.shape == (2, 1, FRAMES * 1920 - 555) == (2, 1, decoder.output_length(FRAMES))
    assert 0.02 < out.std() < 0.5 and (out.abs() >= 1).float().mean() < 1e-3, "audible, hardly clipped"
    with torch.no_grad():
        assert torch.equal(out, reference(codes))
        # Shorter than the attention window (SDPA's is_causal), as long as it, one frame.
        for frames in (1, 2, 4, 5, 17):
            assert torch.equal(decoder(codes[:, :, :frames]), reference(codes[:, :, :frames])), frames


def stream(decoder: Code2Wav, codes: torch.Tensor, step: int) -> torch.Tensor:
    """Decodes `codes` window by window, `step` new frames each, with left_context_frames of context."""
    parts = []
    for start in range(0, codes.shape[-1], step):
        end = min(codes.shape[-1], start + step)
        first = max(0, start - decoder.left_context_frames)
        part = decoder.decode_window(codes[:, :, first:end], end - start)
        assert part.shape[-1] == decoder.output_length(end) - decoder.output_length(start)
        parts.append(part)
    return torch.cat(parts, dim=-1)


def pcm16(x: torch.Tensor) -> torch.Tensor:
    return torch.round(x.clamp(-1, 1) * 32767).to(torch.int32)


def test_windows_concatenate_to_the_whole_decode(code2wav):
    decoder = code2wav[3]
    codes = random_codes(decoder, 2, FRAMES, seed=3)
    whole = decoder(codes)
    # Window by window the convolutions and attention see other lengths, so
    # float32 sums may round differently; nothing more.
    for step in (3, 5, 7):
        streamed = stream(decoder, codes, step)
        torch.testing.assert_close(streamed, whole, rtol=0, atol=1e-5)
        assert (pcm16(streamed) - pcm16(whole)).abs().max() <= 1
    # A window from the first frame that emits everything runs the whole decode's shapes.
    assert torch.equal(decoder.decode_window(codes, FRAMES), whole)
    assert decoder.decode_window(codes, 0).shape == (2, 1, 0)
    with pytest.raises(ValueError, match="num_new"):
        decoder.decode_window(codes[:, :, :4], 5)


def test_left_context_frames_is_the_receptive_field(code2wav):
    """A frame's samples change with the code left_context_frames before it, and
    not with the one before that, nor with any later frame (a whole decode each,
    so shapes and rounding are the same; float64, so an effect at the edge of
    the field is not lost)."""
    _, sd, config, decoder32 = code2wav
    sd64 = {k: v.double() for k, v in sd.items()}
    decoder = Code2Wav(lambda n: sd64[n], config)
    # 2 layers x (5 - 1) frames of attention + 10 frames of convolutions (as for the real model).
    assert decoder.left_context_frames == decoder32.left_context_frames == 18
    assert decoder.conv_context_frames == 10
    codes = random_codes(decoder, 1, decoder.left_context_frames + 6, seed=4)
    frame = codes.shape[-1] - 2  # the samples frame `frame` adds

    def added_with_changed(changed_frame: int) -> torch.Tensor:
        changed = codes.clone()
        changed[:, :, changed_frame] = (changed[:, :, changed_frame] + 1) % decoder.codebook_size
        return decoder(changed)[..., decoder.output_length(frame) : decoder.output_length(frame + 1)]

    added = decoder(codes)[..., decoder.output_length(frame) : decoder.output_length(frame + 1)]
    assert added.shape[-1] == 1920 and added.dtype == torch.float64 and added.abs().max() < 1
    assert torch.equal(added_with_changed(frame - decoder.left_context_frames - 1), added)
    assert (added_with_changed(frame - decoder.left_context_frames) - added).abs().max() > 1e-12
    assert torch.equal(added_with_changed(frame + 1), added)
    assert (added_with_changed(frame) - added).abs().max() > 1e-12


def test_default_receptive_field():
    """Qwen3-Omni's code2wav: 8 layers reaching 71 frames back, 10 more for the convolutions: 46.24 s."""
    config = qwen3_omni_config.Qwen3OmniMoeCode2WavConfig().to_dict()
    assert receptive_field(config) == receptive_field({}) == receptive_field({"code2wav_config": {}}) == (578, 10)


def test_requests_windows_in_one_call(code2wav):
    decoder = code2wav[3]
    a, b = random_codes(decoder, 2, FRAMES, seed=5)
    whole = decoder(torch.stack([a, b]))
    context = decoder.left_context_frames
    # (request, first frame, end frame, new frames): steady windows of equal length,
    # a stream's first window (fewer samples), windows of other lengths, one with no new frames.
    windows = [(0, 20 - context, 23, 3), (1, 3, 3 + context + 3, 3), (1, 0, 4, 4), (0, 30 - context, 35, 5),
               (1, 33 - context, 36, 3), (0, 1, 7, 2), (1, 10, 12, 0)]  # fmt: skip
    codes = [(a, b)[r][:, lo:hi] for r, lo, hi, _ in windows]
    outs = decoder.decode_windows(codes, [n for *_, n in windows])
    for (r, lo, hi, n), window, out in zip(windows, codes, outs, strict=True):
        assert out.shape == (1, decoder.output_length(hi - lo) - decoder.output_length(hi - lo - n))
        # oneDNN picks other algorithms for a batch than for one row: float32 rounding only.
        torch.testing.assert_close(out, decoder.decode_window(window[None], n)[0], rtol=0, atol=1e-6)
        if lo == 0 or hi - n - lo >= context:
            expected = whole[r, :, decoder.output_length(hi - n) : decoder.output_length(hi)]
            torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_invalid_codes_are_named(code2wav):
    decoder = code2wav[3]
    codes = random_codes(decoder, 2, 9)
    codes[1, 2, 7] = decoder.codebook_size
    with pytest.raises(ValueError, match=r"code 64 \(batch row 1, quantizer 2, frame 7\)"):
        decoder(codes)
    with pytest.raises(ValueError, match="code 64"):
        decoder.decode_windows([codes[0], codes[1]], [1, 1])
    codes[1, 2, 7] = -1
    with pytest.raises(ValueError, match="code -1"):
        decoder.decode_window(codes, 2)
    with pytest.raises(ValueError, match="quantizers"):
        decoder(random_codes(decoder, 1, 3)[:, :3])
    with pytest.raises(ValueError, match="integer"):
        decoder(codes.float())
