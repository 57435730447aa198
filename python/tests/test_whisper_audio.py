"""decode_audio: uploaded audio bytes -> float32 mono samples at 16 kHz.

Every clip is made here: a speech-like signal (a few harmonics of a gliding
pitch under a syllable envelope), encoded in memory with PyAV into each
container OpenAI's transcription endpoint accepts. Lossless formats must come
back bit for bit (the int16 input / 32768); lossy ones must correlate with the
source once aligned for the codec's delay. A stereo 44.1 kHz file must become
the channels' average at 16 kHz. Every bad upload must fail as AudioError.
"""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest

from baton_worker.models.whisper.audio import SUPPORTED, AudioError, decode_audio

RATE = 16000


def speech_like(rate: int, seconds: float, f0: float = 140.0) -> np.ndarray:
    """Harmonics 1..6 of a pitch gliding around f0, under a 4 Hz syllable envelope; peak 0.5."""
    t = np.arange(round(rate * seconds)) / rate
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.1 * np.sin(2 * np.pi * 1.5 * t))) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 7))
    envelope = np.sin(np.pi * t / seconds) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t) ** 2)
    x = voice * envelope
    return (0.5 * x / np.abs(x).max()).astype(np.float32)


def quantize(x: np.ndarray) -> np.ndarray:
    return np.round(x * 32767).astype(np.int16)


def encode(x: np.ndarray, rate: int, container: str, codec: str, **options: str) -> bytes:
    """x ([samples] or [channels, samples]; int16 goes in as is, float32 as fltp) as one file's bytes."""
    x = np.atleast_2d(x)
    layout = {1: "mono", 2: "stereo"}[x.shape[0]]
    if x.dtype == np.int16:  # packed: the encoder gets exactly these samples
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x.T).reshape(1, -1), format="s16", layout=layout)
    else:
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x, np.float32), format="fltp", layout=layout)
    frame.sample_rate = rate
    out = io.BytesIO()
    with av.open(out, "w", format=container) as c:
        stream = c.add_stream(codec, rate=rate, layout=layout, options=options)
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            c.mux(packet)
    return out.getvalue()


def wav_bytes(tag: int, data: bytes, channels: int = 1, rate: int = RATE, bits: int = 16, title: bytes = b"") -> bytes:
    """A RIFF/WAVE file by hand, for headers PyAV would not write; `title` goes in a LIST/INFO chunk."""

    def chunk(name: bytes, payload: bytes) -> bytes:
        return name + struct.pack("<I", len(payload)) + payload + b"\0" * (len(payload) % 2)

    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * channels * bits // 8, channels * bits // 8, bits)
    info = chunk(b"LIST", b"INFO" + chunk(b"INAM", title + b"\0")) if title else b""
    return chunk(b"RIFF", b"WAVE" + chunk(b"fmt ", fmt) + info + chunk(b"data", data))


def aligned_correlation(y: np.ndarray, x: np.ndarray, max_lag: int = 2048) -> tuple[float, int]:
    """The best normalised correlation of y[lag:lag + len(x)] with x over 0 <= lag <= max_lag, and its lag."""
    y = np.pad(y, (0, max(0, len(x) + max_lag - len(y))))
    best = (-1.0, 0)
    for lag in range(max_lag + 1):
        seg = y[lag : lag + len(x)]
        r = float(np.dot(seg, x) / (np.linalg.norm(seg) * np.linalg.norm(x) + 1e-12))
        best = max(best, (r, lag))
    return best


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


SOURCE = speech_like(RATE, 1.5)
SOURCE_Q = quantize(SOURCE)


# --- lossless: exact ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("container", "codec"), [("wav", "pcm_s16le"), ("flac", "flac")])
def test_lossless_16k_mono_round_trips_exactly(container, codec):
    y = decode_audio(encode(SOURCE_Q, RATE, container, codec))
    assert y.dtype == np.float32 and y.ndim == 1
    np.testing.assert_array_equal(y, SOURCE_Q.astype(np.float32) / 32768)


# --- lossy: right length, same signal ----------------------------------------------------------------------------

LOSSY = [
    pytest.param("mp3", "libmp3lame", {}, 1, id="mp3"),
    # FFmpeg's own vorbis encoder (there is no libvorbis here) is experimental and stereo only.
    pytest.param("ogg", "vorbis", {"strict": "experimental"}, 2, id="ogg-vorbis"),
    pytest.param("ogg", "libopus", {}, 1, id="ogg-opus"),
    pytest.param("webm", "libopus", {}, 1, id="webm-opus"),
    pytest.param("ipod", "aac", {}, 1, id="m4a-aac"),
    pytest.param("mp4", "aac", {}, 1, id="mp4-aac"),
    pytest.param("mpeg", "mp2", {}, 1, id="mpeg-mp2"),
]


@pytest.mark.parametrize(("container", "codec", "options", "channels"), LOSSY)
def test_lossy_formats_decode_to_the_source(container, codec, options, channels):
    x = SOURCE if channels == 1 else np.stack([SOURCE, SOURCE])
    y = decode_audio(encode(x, RATE, container, codec, **options))
    assert y.dtype == np.float32 and y.ndim == 1
    # Encoders pad to whole frames and some (AAC's 1024 priming samples here) add a delay the file does not mark.
    assert len(SOURCE) - 160 <= len(y) <= len(SOURCE) + 2048
    r, lag = aligned_correlation(y, SOURCE)
    assert r > 0.98, (r, lag)
    assert 0.8 < rms(y[lag : lag + len(SOURCE)]) / rms(SOURCE) < 1.25


def test_lossy_input_at_other_rates_is_resampled():
    """Opus decodes at 48 kHz and this mp3 is 44.1 kHz stereo: both come out at 16 kHz."""
    src = speech_like(44100, 1.5)
    opus = encode(speech_like(48000, 1.5), 48000, "ogg", "libopus")
    for data in (opus, encode(np.stack([src, src]), 44100, "mp3", "libmp3lame")):
        y = decode_audio(data)
        assert abs(len(y) - len(SOURCE)) <= 1024
        r, _ = aligned_correlation(y, SOURCE)
        assert r > 0.98


def test_a_change_of_rate_and_channels_mid_stream():
    """Two mp3s end to end (16 kHz mono, then 44.1 kHz stereo): the decoder switches mid-stream and rejects the
    second file's header packet; decoding goes on with a new resampler, as ffmpeg does."""
    mono = encode(SOURCE, RATE, "mp3", "libmp3lame")
    src = speech_like(44100, 1.5)
    first, y = decode_audio(mono), decode_audio(mono + encode(np.stack([src, src]), 44100, "mp3", "libmp3lame"))
    np.testing.assert_array_equal(y[: len(first) - 1152], first[:-1152])
    assert 2 * len(SOURCE) <= len(y) <= 2 * len(SOURCE) + 2048
    r, _ = aligned_correlation(y[len(first) :], SOURCE)
    assert r > 0.98


# --- resampling and downmix ---------------------------------------------------------------------------------------


def numpy_resample(x: np.ndarray, rate: int, to: int) -> np.ndarray:
    """Band-limited resampling by truncating the spectrum (x ends in silence, so its periodic extension is smooth)."""
    n = round(len(x) * to / rate)
    spectrum = np.fft.rfft(x.astype(np.float64))[: n // 2 + 1]
    return np.fft.irfft(spectrum, n) * (n / len(x))


def test_stereo_44k_wav_becomes_the_mono_16k_average():
    # Different voices per channel: a decoder that kept one channel, or summed them, would fail.
    left, right = speech_like(44100, 1.5, f0=120), speech_like(44100, 1.5, f0=210)
    q = np.stack([quantize(left), quantize(0.6 * right)])
    y = decode_audio(encode(q, 44100, "wav", "pcm_s16le"))
    assert abs(len(y) - len(SOURCE)) <= 2

    # swresample on the same samples outside any container, each channel resampled, then averaged.
    def resample(layout: str | None) -> np.ndarray:
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(q.T).reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = 44100
        resampler = av.AudioResampler(format="fltp", layout=layout, rate=RATE)
        return np.concatenate([f.to_ndarray() for f in [*resampler.resample(frame), *resampler.resample(None)]], axis=1)

    np.testing.assert_allclose(y, resample(None).mean(axis=0), atol=1e-6)
    # swresample's own float downmix is (L + R) / sqrt(2), not the average: why decode_audio averages itself.
    np.testing.assert_allclose(resample("mono")[0], np.sqrt(2) * y, atol=1e-5)

    # And by plain numpy reasoning: the channels' mean, band-limited to 16 kHz.
    expected = numpy_resample(q.astype(np.float64).mean(axis=0) / 32768, 44100, RATE)
    n = min(len(y), len(expected))
    assert np.corrcoef(y[:n], expected[:n])[0, 1] > 0.999
    assert np.abs(y[:n] - expected[:n]).max() < 0.02
    assert 0.98 < rms(y) / rms(expected) < 1.02


@pytest.mark.parametrize("channels", [3, 6, 8, 12])
def test_many_channels_are_averaged(channels):
    """WAV's plain PCM tag gives layouts FFmpeg cannot name ("3 channels"), which its own downmix would drop or
    refuse; and a planar frame of 8 or more channels crashes PyAV's to_ndarray. Each channel here is a constant."""
    levels = 1000 * np.arange(1, channels + 1)
    pcm = np.repeat(levels[None, :], RATE // 10, axis=0).astype(np.int16)
    y = decode_audio(wav_bytes(1, pcm.tobytes(), channels=channels, rate=48000))
    assert abs(len(y) - RATE // 30) <= 2
    np.testing.assert_allclose(y[40:-40], levels.mean() / 32768, rtol=1e-3)


def test_sampling_rate_argument():
    y = decode_audio(encode(SOURCE_Q, RATE, "wav", "pcm_s16le"), sampling_rate=8000)
    assert abs(len(y) - len(SOURCE) // 2) <= 2


# --- edge cases that are fine -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("container", "codec"), [("wav", "pcm_s16le"), ("flac", "flac"), ("mp3", "libmp3lame")])
def test_silence_is_valid(container, codec):
    y = decode_audio(encode(np.zeros(RATE, np.int16), RATE, container, codec))
    assert RATE - 160 <= len(y) <= RATE + 2048 and np.abs(y).max() < 1e-4
    if container != "mp3":
        assert len(y) == RATE and not y.any()


def test_metadata_that_is_not_utf8_is_no_error():
    pcm = SOURCE_Q.tobytes()
    # PyAV's default, metadata_errors="strict", would raise UnicodeDecodeError opening it.
    y = decode_audio(wav_bytes(1, pcm, title=b"\xff\xfe\xc3 not utf-8"))
    np.testing.assert_array_equal(y, decode_audio(wav_bytes(1, pcm)))


def test_max_seconds():
    data = encode(quantize(speech_like(RATE, 3.0)), RATE, "wav", "pcm_s16le")
    assert len(decode_audio(data, max_seconds=3)) == 3 * RATE  # exactly the limit is fine
    with pytest.raises(AudioError, match=r"^file: the audio is 3\.0 s long, over the 2\.5 s limit$"):
        decode_audio(data, max_seconds=2.5)


TRUNCATABLE = [
    ("wav", "pcm_s16le", {}, True),
    ("flac", "flac", {}, True),  # its cut last frame fails to decode and is skipped, as ffmpeg does
    ("mp3", "libmp3lame", {}, False),
    ("ogg", "libopus", {}, False),
    ("webm", "libopus", {}, False),
    ("ipod", "aac", {}, False),  # moov at the end: nothing is left to read
    ("ogg", "vorbis", {"strict": "experimental"}, False),
]


@pytest.mark.parametrize(("container", "codec", "options", "exact"), TRUNCATABLE, ids=[f"{t[0]}-{t[1]}" for t in TRUNCATABLE])
@pytest.mark.parametrize("keep", [0.1, 0.6, 0.95])
def test_truncated_file_decodes_its_start_or_fails_cleanly(container, codec, options, exact, keep):
    x = quantize(speech_like(RATE, 3.0))
    x = np.stack([x, x]) if codec == "vorbis" else x
    data = encode(x, RATE, container, codec, **options)
    full = decode_audio(data)
    try:
        y = decode_audio(data[: int(len(data) * keep)])
    except AudioError as e:
        assert str(e).startswith("file: ")
        return
    assert y.dtype == np.float32 and 0 < len(y) <= len(full)
    if exact:
        np.testing.assert_array_equal(y, full[: len(y)])
    else:  # a decoder's last frames before the cut may differ: compare what comes well before it
        head = len(y) - 2048
        if head > RATE // 4:
            assert np.corrcoef(y[:head], full[:head])[0, 1] > 0.99


# --- errors -------------------------------------------------------------------------------------------------------


def png_bytes() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def video_only_mp4() -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as c:
        stream = c.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
        frames = [av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24") for _ in range(3)]
        for packet in [p for f in [*frames, None] for p in stream.encode(f)]:
            c.mux(packet)
    return out.getvalue()


# An SDP file makes FFmpeg's sdp demuxer listen for RTP on UDP; only the audio containers may be probed.
SDP = b"v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=x\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 5004 RTP/AVP 0\r\n"

UNREADABLE = r"^file: not a readable audio file \(.+\); supported formats: flac, mp3, mp4, mpeg, mpga, m4a, ogg, wav, webm$"
BAD = [
    pytest.param(b"", r"^file: the file is empty \(0 bytes\)$", id="empty"),
    pytest.param(np.random.default_rng(0).bytes(4096), UNREADABLE, id="random"),
    pytest.param(b"hello, this is not audio\n" * 20, UNREADABLE, id="text"),
    pytest.param(png_bytes(), UNREADABLE, id="png"),
    pytest.param(SDP, UNREADABLE, id="sdp"),
    pytest.param(video_only_mp4(), r"^file: the mov,mp4,m4a,3gp,3g2,mj2 file has no audio stream \(only video\)$", id="video"),
    pytest.param(wav_bytes(0x9999, bytes(3200)), r"^file: the wav file's audio is in a codec FFmpeg cannot decode$", id="codec"),
    pytest.param(wav_bytes(1, b""), r"^file: the file decodes to no audio samples$", id="no-samples"),
    # A 1 Hz header would make 16000 output samples of each input one.
    pytest.param(wav_bytes(1, bytes(3200), rate=1), r"^file: the audio's sample rate, 1 Hz, is implausible$", id="rate-1hz"),
    pytest.param(wav_bytes(1, bytes(3200), rate=10**9), r"sample rate, 1000000000 Hz, is implausible$", id="rate-1ghz"),
]


@pytest.mark.parametrize(("data", "message"), BAD)
def test_bad_uploads_raise_audio_error(data, message):
    with pytest.raises(AudioError, match=message) as caught:
        decode_audio(data)
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)


def test_message_names_the_parameter_and_lists_formats():
    with pytest.raises(AudioError, match=r"^audio_file: ") as caught:
        decode_audio(png_bytes(), param="audio_file")
    assert SUPPORTED in str(caught.value)
    for name in ("flac", "mp3", "mp4", "mpeg", "mpga", "m4a", "ogg", "wav", "webm"):
        assert name in SUPPORTED


class _Spy:
    """av.open's container, recording whether it was closed."""

    def __init__(self, container, opened):
        self._container, self.closed = container, False
        opened.append(self)

    def __getattr__(self, name):
        return getattr(self._container, name)

    def __enter__(self):
        return self._container.__enter__()

    def __exit__(self, *exc):
        self.closed = True
        return self._container.__exit__(*exc)


@pytest.mark.parametrize(
    ("data", "max_seconds"),
    [
        # FLAC: a plain 16 kHz WAV is read without FFmpeg (_plain_wav).
        pytest.param(encode(SOURCE_Q, RATE, "flac", "flac"), None, id="ok"),
        pytest.param(encode(SOURCE_Q, RATE, "flac", "flac"), 1.0, id="too-long"),
        pytest.param(video_only_mp4(), None, id="video-only"),
        pytest.param(wav_bytes(0x9999, bytes(3200)), None, id="unknown-codec"),
        pytest.param(wav_bytes(1, bytes(3200), rate=1), None, id="rate-1hz"),  # raised mid-decode
    ],
)
def test_containers_are_closed(monkeypatch, data, max_seconds):
    opened: list[_Spy] = []
    real_open = av.open
    monkeypatch.setattr(av, "open", lambda *a, **k: _Spy(real_open(*a, **k), opened))
    try:
        decode_audio(data, max_seconds=max_seconds)
    except AudioError:
        pass
    assert len(opened) == 1 and opened[0].closed


@pytest.mark.parametrize("channels", [1, 2])
def test_plain_wav_read_without_ffmpeg_equals_pyav(channels, monkeypatch):
    """16-bit PCM WAV at the model's rate skips FFmpeg; its samples are the ones PyAV's path gives."""
    from baton_worker.models.whisper import audio

    x = quantize(speech_like(RATE, 1.2))
    x = np.stack([x, quantize(speech_like(RATE, 1.2, f0=220.0))]) if channels == 2 else x
    data = encode(x, RATE, "wav", "pcm_s16le")
    fast = decode_audio(data)
    assert audio._plain_wav(data, RATE) is not None
    monkeypatch.setattr(audio, "_plain_wav", lambda data, rate: None)
    np.testing.assert_array_equal(fast, decode_audio(data))
