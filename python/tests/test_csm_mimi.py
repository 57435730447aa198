"""Mimi's decoder (baton_worker.models.csm.mimi) against transformers' MimiModel.decode,
on tiny random-weight codecs saved by transformers and read back through WeightReader:

- a MimiModel directory (names without prefix; GQA, output projections) and the
  codec inside a CsmForConditionalGeneration directory (`codec_model.` names,
  `codec_config` in config.json; attention biases, conv shortcuts, two residual
  layers, no output projections): the whole-sequence decode is the same bits as
  transformers', for sequences shorter and longer than the attention window and
  for fewer codebooks than the codec has;
- streaming: windows of 3, 5 and 7 new frames with left_context_frames of
  context concatenate to the whole decode (float32 rounding apart), and a
  frame's samples depend on the code left_context_frames before it but not
  on any earlier one;
- batching: windows of several requests, of different lengths, in one call
  give each the samples it gets alone;
- a code outside the codebook raises a ValueError naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from baton_worker.model.weights import WeightReader  # noqa: E402
from baton_worker.models.csm.mimi import MimiDecoder, receptive_field  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRAMES = 40
# Real frame structure (24 kHz, ratios 8*6*5*4, 12.5 Hz frames upsampled to 25 Hz), tiny widths,
# attention windows shorter than the test sequences so the sliding-window mask matters.
MIMI = dict(
    hidden_size=32, num_filters=4, codebook_size=64, codebook_dim=16, num_quantizers=4,
    vector_quantization_hidden_dimension=16, upsample_groups=32, num_hidden_layers=2,
    intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, sliding_window=6,
)  # fmt: skip
CSM_CODEC = dict(
    model_type="mimi", hidden_size=48, num_filters=4, codebook_size=32, codebook_dim=48, num_quantizers=3,
    vector_quantization_hidden_dimension=48, upsample_groups=48, num_hidden_layers=3, intermediate_size=96,
    num_attention_heads=4, num_key_value_heads=4, sliding_window=5, num_residual_layers=2,
    use_conv_shortcut=True, attention_bias=True,
)  # fmt: skip


def redraw(model: torch.nn.Module, seed: int) -> None:
    """Seeded weights of about unit gain, so the PCM is neither silent nor saturated."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=g)
            if p.dim() > 1:
                p.copy_(r / p[0].numel() ** 0.5)
            elif name.endswith("layer_scale.scale"):
                p.copy_(0.3 + 0.1 * r)
            elif "layernorm.weight" in name:
                p.copy_(1 + 0.2 * r)
            else:
                p.copy_(0.1 * r)
        for name, b in sorted(model.named_buffers()):
            if name.endswith("codebook.embed_sum"):
                b.copy_(torch.randn(b.shape, generator=g))
            elif name.endswith("codebook.cluster_usage"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
        # Speech-like levels (peaks near 0.3): the streaming tolerance is absolute.
        model.decoder.layers[-1].conv.weight.mul_(0.2)


def load(directory: Path, dtype: torch.dtype = torch.float32, prefix: str | None = None) -> MimiDecoder:
    config = json.loads((directory / "config.json").read_text())
    get = WeightReader(directory, dtype, torch.device("cpu")).get
    return MimiDecoder(get, config) if prefix is None else MimiDecoder(get, config, prefix=prefix)


@pytest.fixture(scope="module")
def mimi(tmp_path_factory):
    """(transformers' MimiModel, our decoder from its saved directory, the directory, its weight prefix)."""
    model = transformers.MimiModel(transformers.MimiConfig(**MIMI)).eval()
    redraw(model, 1)
    directory = tmp_path_factory.mktemp("mimi")
    model.save_pretrained(directory)
    return model, load(directory, prefix=""), directory, ""


@pytest.fixture(scope="module")
def csm(tmp_path_factory):
    """(the codec of a CsmForConditionalGeneration, our decoder from the saved CSM directory, the directory, None: the default prefix)."""
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    config = transformers.CsmConfig(
        codec_config=CSM_CODEC, num_codebooks=3, vocab_size=64, text_vocab_size=100, **small,
        depth_decoder_config=dict(num_codebooks=3, vocab_size=64, backbone_hidden_size=32, **small),
    )  # fmt: skip
    model = transformers.CsmForConditionalGeneration(config).eval()
    redraw(model.codec_model, 2)
    directory = tmp_path_factory.mktemp("csm")
    model.save_pretrained(directory)
    assert "codec_config" in json.loads((directory / "config.json").read_text())
    return model.codec_model, load(directory), directory, None


@pytest.fixture(params=["mimi", "csm"])
def codec(request):
    return request.getfixturevalue(request.param)


def random_codes(decoder: MimiDecoder, batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, decoder.codebook_size, (batch, decoder.num_codebooks, frames), generator=g)


def reference_decode(model, codes: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.decode(codes).audio_values


def test_whole_decode_is_transformers_bits(codec):
    reference, decoder = codec[:2]
    codes = random_codes(decoder, 2, FRAMES)
    out = decoder(codes)
    assert out.shape == (2, 1, FRAMES * decoder.frame_samples) and decoder.frame_samples == 1920
    assert 0.005 < out.std() < 1, "random weights should give audible, unsaturated PCM"
    assert torch.equal(out, reference_decode(reference, codes))
    # Shorter than the attention window (SDPA's is_causal), one frame, fewer codebooks.
    for frames in (1, 2, 3):
        assert torch.equal(decoder(codes[:, :, :frames]), reference_decode(reference, codes[:, :, :frames]))
    assert torch.equal(decoder(codes[:, :2, :9]), reference_decode(reference, codes[:, :2, :9]))


def stream(decoder: MimiDecoder, codes: torch.Tensor, step: int) -> torch.Tensor:
    """Decodes `codes` window by window, `step` new frames each, with left_context_frames of context."""
    parts = []
    for start in range(0, codes.shape[-1], step):
        end = min(codes.shape[-1], start + step)
        first = max(0, start - decoder.left_context_frames)
        parts.append(decoder.decode_window(codes[:, :, first:end], end - start))
    return torch.cat(parts, dim=-1)


def test_windows_concatenate_to_the_whole_decode(codec):
    decoder = codec[1]
    codes = random_codes(decoder, 2, FRAMES, seed=3)
    whole = decoder(codes)
    # Window by window the convolutions and attention see other lengths, so
    # float32 sums may round differently; nothing more.
    for step in (3, 5, 7):
        torch.testing.assert_close(stream(decoder, codes, step), whole, rtol=0, atol=1e-6)
    # A window from the first frame that emits everything runs the whole decode's shapes.
    assert torch.equal(decoder.decode_window(codes, FRAMES), whole)
    assert decoder.decode_window(codes, 0).shape == (2, 1, 0)
    with pytest.raises(ValueError, match="num_new"):
        decoder.decode_window(codes[:, :, :4], 5)


@pytest.mark.parametrize(("codec", "context"), [("mimi", 10), ("csm", 12)], indirect=["codec"])
def test_left_context_frames_is_the_receptive_field(codec, context):
    """A frame's samples change with the code left_context_frames before it,
    and not with the one before that (a whole decode each, so shapes and rounding
    are the same; float64, so an effect at the edge of the field is not lost)."""
    _, decoder32, directory, prefix = codec
    decoder = load(directory, torch.float64, prefix=prefix)
    # Mimi's: 2 layers x (6 - 1) transformer positions + 8 SEANet positions, then the upsample's one frame.
    # CSM's: 3 x (5 - 1) + 9 SEANet positions (two residual convs per stage, dilations 1 and 2) + 1.
    assert decoder.left_context_frames == decoder32.left_context_frames == context
    codes = random_codes(decoder, 1, decoder.left_context_frames + 6, seed=4)
    first, fs = codes.shape[-1] - 2, decoder.frame_samples  # the last two frames

    def tail_with_changed(frame: int) -> torch.Tensor:
        changed = codes.clone()
        changed[:, :, frame] = (changed[:, :, frame] + 1) % decoder.codebook_size
        return decoder(changed)[..., first * fs :]

    tail = decoder(codes)[..., first * fs :]
    assert torch.equal(tail_with_changed(first - decoder.left_context_frames - 1), tail)
    assert (tail_with_changed(first - decoder.left_context_frames) - tail).abs().max() > 1e-12


def test_csm_default_codec_context():
    """sesame/csm-1b's codec: 8 layers reaching 249 positions of 25 Hz back, 8 more for the convs."""
    assert receptive_field(transformers.CsmConfig().to_dict()) == (1001, 8)
    assert receptive_field({}) == (1001, 8)


def test_requests_windows_in_one_call(codec):
    decoder = codec[1]
    a, b = random_codes(decoder, 2, FRAMES, seed=5)
    whole = decoder(torch.stack([a, b]))
    fs, context = decoder.frame_samples, decoder.left_context_frames
    # (request, first frame, end frame, new frames): steady windows of equal length
    # (one batch), a stream's first window and windows of other lengths.
    windows = [(0, 20 - context, 23, 3), (1, 3, 3 + context + 3, 3), (1, 0, 4, 4), (0, 30 - context, 35, 5), (1, 33 - context, 36, 3)]
    codes = [(a, b)[r][:, lo:hi] for r, lo, hi, _ in windows]
    outs = decoder.decode_windows(codes, [n for *_, n in windows])
    for (r, lo, hi, n), window, out in zip(windows, codes, outs, strict=True):
        assert out.shape == (1, n * fs)
        # oneDNN picks other convolution algorithms for a batch than for one row: float32 rounding only.
        torch.testing.assert_close(out, decoder.decode_window(window[None], n)[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(out, whole[r, :, (hi - n) * fs : hi * fs], rtol=0, atol=1e-6)


def test_invalid_code_is_named(mimi):
    decoder = mimi[1]
    codes = random_codes(decoder, 2, 9)
    codes[1, 2, 7] = decoder.codebook_size
    with pytest.raises(ValueError, match=r"code 64 \(batch row 1, codebook 2, frame 7\)"):
        decoder(codes)
    with pytest.raises(ValueError, match="code 64"):
        decoder.decode_windows([codes[0], codes[1]], [1, 1])
    codes[1, 2, 7] = -1
    with pytest.raises(ValueError, match="code -1"):
        decoder.decode_window(codes, 2)
    with pytest.raises(ValueError, match="codebooks"):
        decoder(random_codes(decoder, 1, 3).repeat(1, 2, 1))
    with pytest.raises(ValueError, match="integer"):
        decoder(codes.float())
