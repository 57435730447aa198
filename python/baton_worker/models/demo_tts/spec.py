"""The demo TTS model's fixed shape: vocabulary layout, codec and stream settings.

One definition: the builder writes these into the model directory's
config.json, and everything at run time reads them back from there
(`DemoTTSSpec.from_dir`), so a directory describes itself.

Vocabulary (585 ids, in this order):
    0..255        text: one token per UTF-8 byte (id = byte value)
    256           <|bos|>
    257           <|start_of_speech|>
    258           <|end_of_audio|>          (the LLM's EOS; ends the audio)
    259..264      one token per voice: alloy, echo, fable, onyx, nova, shimmer
    265..584      audio codes: id = 265 + position * 80 + code, for the
                  code (0..79) at a position (0..3) inside a frame
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

ARCHITECTURE = "BatonDemoTTS"
VOICES = ("alloy", "echo", "fable", "onyx", "nova", "shimmer")
DEFAULT_VOICE = "alloy"
SAMPLE_RATE = 24000


@dataclass(frozen=True)
class TokenLayout:
    num_text: int = 256
    bos: int = 256
    start_of_speech: int = 257
    end_of_audio: int = 258
    first_voice: int = 259
    voices: tuple[str, ...] = VOICES
    audio_offset: int = 265
    codebook_size: int = 80
    codes_per_frame: int = 4

    @property
    def vocab_size(self) -> int:
        return self.audio_offset + self.codes_per_frame * self.codebook_size

    def voice_id(self, voice: str) -> int:
        return self.first_voice + self.voices.index(voice)

    def audio_token(self, position: int, code: int) -> int:
        return self.audio_offset + position * self.codebook_size + code


@dataclass(frozen=True)
class CodecSpec:
    """The convolutional decoder: frames of `codes_per_frame` codes -> PCM."""

    codebook_size: int = 80
    codes_per_frame: int = 4
    embed_dim: int = 64  # per code; a frame is the concatenation of its codes' embeddings
    hidden: int = 256
    up_channels: tuple[int, ...] = (128, 64, 32)
    up_strides: tuple[int, ...] = (8, 6, 10)  # product = samples per frame
    out_kernel: int = 7

    @property
    def samples_per_frame(self) -> int:
        n = 1
        for s in self.up_strides:
            n *= s
        return n


@dataclass(frozen=True)
class StreamSpec:
    """The llm -> codec connection: SlidingWindowChunkPolicy(window_tokens, stride_tokens)."""

    window_tokens: int = 16  # 4 frames
    stride_tokens: int = 4  # 1 frame


@dataclass(frozen=True)
class DemoTTSSpec:
    tokens: TokenLayout = TokenLayout()
    codec: CodecSpec = CodecSpec()
    stream: StreamSpec = StreamSpec()
    sample_rate: int = SAMPLE_RATE
    max_tokens: int = 2048  # the token cap (decode_loop's max_iters)
    llm_dir: str = "llm"
    codec_weights: str = "codec.safetensors"

    def __post_init__(self) -> None:
        t, c, s = self.tokens, self.codec, self.stream
        if (t.codebook_size, t.codes_per_frame) != (c.codebook_size, c.codes_per_frame):
            raise ValueError("tokens and codec disagree on the codebook")
        # The window arithmetic (streaming.py) needs windows on frame boundaries
        # and a stride of exactly one frame; see its docstring.
        if s.stride_tokens != c.codes_per_frame or s.window_tokens % c.codes_per_frame or s.window_tokens < s.stride_tokens:
            raise ValueError("stream window must be a multiple of a frame and the stride exactly one frame")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")

    @property
    def tokens_per_frame(self) -> int:
        return self.codec.codes_per_frame

    def to_config(self) -> dict:
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "baton_demo_tts",
            "llm": self.llm_dir,
            "sample_rate": self.sample_rate,
            "max_tokens": self.max_tokens,
            "tokens": _plain(asdict(self.tokens)),
            "codec": {**_plain(asdict(self.codec)), "weights": self.codec_weights, "samples_per_frame": self.codec.samples_per_frame},
            "stream": {**asdict(self.stream), "policy": "sliding_window"},
        }

    @staticmethod
    def from_config(raw: dict) -> DemoTTSSpec:
        if ARCHITECTURE not in (raw.get("architectures") or []):
            raise ValueError(f"config.json is not a {ARCHITECTURE} model")
        tokens = dict(raw["tokens"])
        tokens["voices"] = tuple(tokens["voices"])
        codec = {k: v for k, v in raw["codec"].items() if k not in ("weights", "samples_per_frame")}
        for key in ("up_channels", "up_strides"):
            codec[key] = tuple(codec[key])
        stream = {k: v for k, v in raw["stream"].items() if k != "policy"}
        return DemoTTSSpec(
            tokens=TokenLayout(**tokens),
            codec=CodecSpec(**codec),
            stream=StreamSpec(**stream),
            sample_rate=int(raw["sample_rate"]),
            max_tokens=int(raw["max_tokens"]),
            llm_dir=str(raw["llm"]),
            codec_weights=str(raw["codec"]["weights"]),
        )

    @staticmethod
    def from_dir(model_dir: str | Path) -> DemoTTSSpec:
        return DemoTTSSpec.from_config(json.loads((Path(model_dir) / "config.json").read_text()))


def _plain(value: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
