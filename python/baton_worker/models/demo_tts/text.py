"""Prompts and the tokenizer files of the demo TTS LLM.

Text is UTF-8 bytes, one token per byte (token id = byte value), so the worker
encodes it without any tokenizer library. Strings that look like special
tokens ("<|bos|>") are plain text here: a request cannot inject a voice or
control token. tokenizer.json describes the same vocabulary for
tools that load an HF directory (Baton's TypeScript side, transformers): a
byte-level BPE with the 256 byte symbols and no merges, plus every special,
voice and audio-code token as an added special token.
"""

from __future__ import annotations

import torch

from .spec import DEFAULT_VOICE, TokenLayout


def prompt_ids(text: str, voice: str | None, layout: TokenLayout) -> list[int]:
    """[bos, voice, text bytes..., start_of_speech]; voice None means the default voice."""
    name = DEFAULT_VOICE if voice is None else str(voice).lower()
    if name not in layout.voices:
        raise ValueError(f"unknown voice {voice!r}; valid voices: {', '.join(layout.voices)}")
    return [layout.bos, layout.voice_id(name), *text.encode("utf-8"), layout.start_of_speech]


def prompt_tensors(text: str, voice: str | None, layout: TokenLayout) -> dict[str, list[torch.Tensor]]:
    """process_prompt's result: the llm's `text_inputs`."""
    return {"text_inputs": [torch.tensor(prompt_ids(text, voice, layout), dtype=torch.int64)]}


def special_tokens(layout: TokenLayout) -> list[tuple[int, str]]:
    """(id, content) of every token above the byte range, in id order."""
    names = [(layout.bos, "<|bos|>"), (layout.start_of_speech, "<|start_of_speech|>"), (layout.end_of_audio, "<|end_of_audio|>")]
    names += [(layout.voice_id(v), f"<|voice:{v}|>") for v in layout.voices]
    names += [
        (layout.audio_token(q, c), f"<|audio:{q}:{c}|>")
        for q in range(layout.codes_per_frame)
        for c in range(layout.codebook_size)
    ]
    names.sort()
    if [i for i, _ in names] != list(range(layout.num_text, layout.vocab_size)):
        raise ValueError("token layout has gaps or overlaps")
    return names


def byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte 0..255."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def tokenizer_json(layout: TokenLayout) -> dict:
    """tokenizer.json exactly as the `tokenizers` package writes this tokenizer (checked by a test)."""
    added = [
        {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        for i, content in special_tokens(layout)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {s: b for b, s in enumerate(byte_symbols())},
            "merges": [],
        },
    }


def tokenizer_config(max_length: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|bos|>",
        "eos_token": "<|end_of_audio|>",
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
