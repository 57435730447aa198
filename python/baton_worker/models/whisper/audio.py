"""An uploaded audio file's bytes -> what Whisper's feature extractor takes:
mono float32 samples at 16 kHz (or `sampling_rate`).

PyAV decodes: it bundles FFmpeg's demuxers, decoders and libswresample, so
the worker needs no ffmpeg binary or subprocess and reads straight from
memory. libswresample resamples each channel (its defaults, as the
`ffmpeg -ar 16000` of openai-whisper's load_audio and transformers'
ffmpeg_read), then the channels are averaged: for stereo, what openai-whisper
gets from `-ac 1 -f s16le`. (swresample's own downmix to float would be
(L + R) / sqrt(2), louder than either channel.) Like ffmpeg, a damaged packet
(a truncated file's last one, say) is skipped and the rest decoded.

Only the containers OpenAI's /v1/audio/transcriptions accepts are probed
(flac, mp3/mpga, mp4/m4a, mpeg, ogg, wav, webm): FFmpeg's other demuxers never
see the bytes, so an upload cannot, say, make the worker listen for a network
stream (an SDP file) or open other files (a playlist).
"""

from __future__ import annotations

import io
import struct
import wave

import av
import numpy as np

# FFmpeg's demuxers for those: mov reads mp4/m4a, matroska webm, mp3 mpga/mpeg audio, mpeg MPEG-PS.
DEMUXERS = "wav,flac,mp3,mov,ogg,matroska,mpeg"
SUPPORTED = "flac, mp3, mp4, mpeg, mpga, m4a, ogg, wav, webm"
# Input sample rates outside this are a damaged or hostile header: 1 Hz would be resampled 16000-fold
# (gigabytes from a few kilobytes), 1 GHz takes swresample seconds to set up.
RATES = (1000, 768000)


class AudioError(ValueError):
    """One upload cannot be used as audio; the message names the request's parameter and the problem."""


def decode_audio(
    data: bytes, param: str = "file", sampling_rate: int = 16000, max_seconds: float | None = None
) -> np.ndarray:
    """The first audio stream of `data` as float32 mono samples at `sampling_rate`. AudioError for an empty,
    unrecognised, audio-less or undecodable file, one that decodes to no samples, or one longer than
    `max_seconds`."""
    if len(data) == 0:
        raise AudioError(f"{param}: the file is empty (0 bytes)")
    samples = _plain_wav(data, sampling_rate)
    if samples is not None:
        if max_seconds is not None and len(samples) > round(max_seconds * sampling_rate):
            raise AudioError(f"{param}: the audio is {len(samples) / sampling_rate:.1f} s long, over the {max_seconds:g} s limit")
        return samples
    try:
        container = av.open(io.BytesIO(data), options={"format_whitelist": DEMUXERS}, metadata_errors="replace")
    except av.FFmpegError as e:
        if isinstance(e, av.EOFError):
            raise AudioError(f"{param}: the file ends before its audio does (truncated?)") from None
        # A format off the whitelist fails as EINVAL ("Invalid argument"), which says nothing useful.
        why = "unknown or unsupported format" if isinstance(e, av.ArgumentError) else e.strerror
        raise AudioError(f"{param}: not a readable audio file ({why}); supported formats: {SUPPORTED}") from None
    with container:
        kind = container.format.name
        if not container.streams.audio:
            found = ", ".join(sorted({s.type for s in container.streams})) or "no streams"
            raise AudioError(f"{param}: the {kind} file has no audio stream (only {found})")
        stream = container.streams.audio[0]
        if stream.codec_context is None:
            raise AudioError(f"{param}: the {kind} file's audio is in a codec FFmpeg cannot decode")
        codec = stream.codec_context.name
        limit = None if max_seconds is None else round(max_seconds * sampling_rate)
        chunks: list[np.ndarray] = []
        count = 0
        damaged: list[av.FFmpegError] = []
        try:
            for out in _resampled(_frames(container, stream, damaged), sampling_rate, param):
                chunks.append(out.to_ndarray().reshape(-1, out.layout.nb_channels).mean(axis=1, dtype=np.float32))
                count += out.samples
                if limit is not None and count > limit:
                    known = container.duration / av.time_base if container.duration else 0.0
                    seconds = max(known, count / sampling_rate)
                    raise AudioError(f"{param}: the audio is {seconds:.1f} s long, over the {max_seconds:g} s limit")
        except AudioError:
            raise
        except (av.FFmpegError, ValueError) as e:
            raise AudioError(f"{param}: cannot decode the {kind} file's {codec} audio: {_why(e)}") from None
    if count == 0:
        if damaged:
            raise AudioError(f"{param}: cannot decode the {kind} file's {codec} audio: {_why(damaged[-1])}")
        raise AudioError(f"{param}: the file decodes to no audio samples")
    return np.concatenate(chunks)


def _plain_wav(data: bytes, sampling_rate: int) -> np.ndarray | None:
    """A whole 16-bit PCM WAV of one or two channels already at sampling_rate (what clients mostly send),
    read without FFmpeg: the samples PyAV's path gives (s16 / 32768, channels averaged in float32), in a
    fraction of its time. None for anything else (another format, rate or width, a truncated or empty data
    chunk), which PyAV decodes."""
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            channels, width, rate, frames = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if width != 2 or rate != sampling_rate or channels not in (1, 2) or frames == 0:
                return None
            raw = w.readframes(frames)
    except (wave.Error, EOFError, struct.error):
        return None
    if len(raw) != frames * channels * 2:
        return None
    x = np.frombuffer(raw, "<i2").astype(np.float32) / np.float32(32768)
    return x if channels == 1 else x.reshape(-1, channels).mean(axis=1, dtype=np.float32)


def _frames(container, stream, damaged: list):
    """The stream's decoded frames. A packet its decoder rejects is skipped and its error kept in `damaged`."""
    for packet in container.demux(stream):  # the last, empty packet flushes the decoder
        try:
            frames = packet.decode()
        except av.InvalidDataError as e:
            damaged.append(e)
            continue
        yield from frames


def _resampled(frames, sampling_rate: int, param: str):
    """The frames at sampling_rate as packed float, channels kept: PyAV's to_ndarray reads past AVFrame.data for
    a planar frame of 8 or more channels (a segfault), and swresample's own downmix drops or refuses the channels
    of a layout it cannot name (a WAV's "3 channels"). A change of format, layout or rate mid-stream (a damaged
    mp3 frame, say) flushes the resampler and starts another, as ffmpeg's filter graph does."""
    resampler, source = None, None
    for frame in frames:
        if not RATES[0] <= frame.sample_rate <= RATES[1]:
            raise AudioError(f"{param}: the audio's sample rate, {frame.sample_rate} Hz, is implausible")
        if (frame.format.name, frame.layout.name, frame.sample_rate) != source:
            if resampler is not None:
                yield from resampler.resample(None)
            resampler = av.AudioResampler(format="flt", rate=sampling_rate)
            source = (frame.format.name, frame.layout.name, frame.sample_rate)
        yield from resampler.resample(frame)
    if resampler is not None:
        yield from resampler.resample(None)


def _why(e: Exception) -> str:
    return e.strerror if isinstance(e, av.FFmpegError) and e.strerror else str(e)
