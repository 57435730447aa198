"""Plain-PyTorch reference for the demo TTS model: what Baton must produce, byte for byte.

    ref = Reference("models/demo-tts")
    result = ref.speech("Hello there.", voice="nova", seed=7, temperature=1.0, max_tokens=400)
    result.pcm            # s16le mono bytes, 24 kHz
    result.tokens         # the generated ids, end-of-audio last when it stopped the loop
    result.chunk_bytes    # bytes each codec chunk emitted, in chunk order

CLI: python -m baton_worker.models.demo_tts.reference MODEL_DIR --text ... [--voice] [--seed]
     [--temperature] [--max-tokens] [--out FILE.pcm]

The LLM runs in transformers' LlamaForCausalLM (float32, its own KV cache, no
paging), sampling exactly as Baton's worker does for a seeded request
(sampler.py): temperature below SAMPLING_EPS is argmax of the raw logits;
otherwise softmax(logits / T), then the worker's inverse-CDF draw
(sampler.inverse_cdf) with u = sampler.seeded_uniform(seed, i) for the i-th
generated token (no top-k/top-p). It stops
after end-of-audio (which is kept as the stream's last item) or at max_tokens
generated tokens, the first one (prefill's) included. Then the codec runs over
exactly the chunks SlidingWindowChunkPolicy yields for that many items
(streaming.sliding_window_chunks), one chunk at a time, through the same
CodecStream the `codec` node uses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ...sampling.sampler import SAMPLING_EPS, inverse_cdf, seeded_uniform
from .audio import pcm_to_s16le
from .spec import DemoTTSSpec
from .streaming import CodecStream, load_codec_stream, sliding_window_chunks
from .text import prompt_ids

@dataclass
class ReferenceResult:
    prompt_ids: list[int]
    tokens: list[int]
    finish_reason: str  # "stop" (end-of-audio) or "length" (max_tokens)
    chunk_bytes: list[int]
    pcm: bytes

    def frames(self, spec: DemoTTSSpec) -> list[list[int]]:
        """The audio frames' codes, in order: every complete frame before end-of-audio."""
        t = spec.tokens
        items = self.tokens[:-1] if self.finish_reason == "stop" else self.tokens
        f = spec.tokens_per_frame
        return [
            [(tok - t.audio_offset) % t.codebook_size for tok in items[k * f : (k + 1) * f]] for k in range(len(items) // f)
        ]


def sample_token(logits: torch.Tensor, temperature: float, seed: int | None, position: int) -> int:
    """Output token `position` (0: the first) from float32 logits [vocab], as Baton's worker samples a seeded request."""
    if temperature < SAMPLING_EPS:
        return int(torch.argmax(logits))
    if seed is None:
        raise ValueError("sampling with temperature > 0 needs a seed to be reproducible")
    probs = torch.softmax(logits / temperature, dim=-1)
    return int(inverse_cdf(probs[None], torch.tensor([[seeded_uniform(seed, position)]])))


class Reference:
    def __init__(self, model_dir: str | Path):
        from transformers import LlamaForCausalLM  # test/reference dependency only

        self.model_dir = Path(model_dir)
        self.spec = DemoTTSSpec.from_dir(self.model_dir)
        self.llm = LlamaForCausalLM.from_pretrained(self.model_dir / self.spec.llm_dir, dtype=torch.float32).eval()
        self.codec: CodecStream = load_codec_stream(self.model_dir)

    @torch.inference_mode()
    def generate(self, prompt: list[int], max_tokens: int, temperature: float, seed: int | None) -> tuple[list[int], str]:
        """Generated ids and the finish reason ("stop" or "length")."""
        eoa = self.spec.tokens.end_of_audio
        out = self.llm(input_ids=torch.tensor([prompt]), use_cache=True)
        tokens: list[int] = []
        while True:
            token = sample_token(out.logits[0, -1].float(), temperature, seed, len(tokens))
            tokens.append(token)
            if token == eoa:
                return tokens, "stop"
            if len(tokens) >= max_tokens:
                return tokens, "length"
            out = self.llm(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)

    def decode(self, tokens: list[int]) -> list[bytes]:
        """The s16le bytes each chunk of the stream emits, in chunk order."""
        s = self.spec.stream
        items = torch.tensor(tokens, dtype=torch.int64)
        chunks = []
        for chunk, length in sliding_window_chunks(len(tokens), s.window_tokens, s.stride_tokens):
            (pcm,) = self.codec([items[chunk.start : chunk.start + length]], [chunk])
            chunks.append(pcm_to_s16le(pcm))
        return chunks

    def speech(
        self,
        text: str,
        voice: str | None = None,
        seed: int | None = None,
        temperature: float = 1.0,
        max_tokens: int | None = None,
    ) -> ReferenceResult:
        prompt = prompt_ids(text, voice, self.spec.tokens)
        cap = self.spec.max_tokens if max_tokens is None else max_tokens
        if cap < 1:
            raise ValueError("max_tokens must be >= 1")
        tokens, reason = self.generate(prompt, cap, temperature, seed)
        chunks = self.decode(tokens)
        return ReferenceResult(prompt, tokens, reason, [len(c) for c in chunks], b"".join(chunks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baton_worker.models.demo_tts.reference")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--text", required=True)
    parser.add_argument("--voice")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--out", type=Path, help="write the s16le PCM here")
    args = parser.parse_args(argv)
    ref = Reference(args.model_dir)
    started = time.perf_counter()
    result = ref.speech(args.text, args.voice, args.seed, args.temperature, args.max_tokens)
    elapsed = time.perf_counter() - started
    if args.out is not None:
        args.out.write_bytes(result.pcm)
    summary = {
        "prompt_tokens": len(result.prompt_ids),
        "tokens": len(result.tokens),
        "finish_reason": result.finish_reason,
        "chunks": len(result.chunk_bytes),
        "pcm_bytes": len(result.pcm),
        "audio_seconds": len(result.pcm) / 2 / ref.spec.sample_rate,
        "seconds": round(elapsed, 3),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
