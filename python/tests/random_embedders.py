"""Random-weight embedding models for the pooling parity tests, built the way
a user's directory is: transformers' own classes, saved by
sentence-transformers' own SentenceTransformer(modules=[...]).save(dir).

Library:  make_embedder(kind, out_dir) -> Path;  st_encode(model_dir, texts) -> np.ndarray
CLI:      python python/tests/random_embedders.py build --kind bert-cls --out DIR
          python python/tests/random_embedders.py encode --model DIR < texts.json  (prints {"embeddings": [[...]]})

kinds: bert-cls (CLS pooling, not normalized), bert-mean-norm (mean, Normalize),
bert-cls-norm, bert-mean, xlm-roberta-mean-norm (RoBERTa position ids), and
qwen3-last (a Qwen3Model with last-token pooling and Normalize, the
Qwen3-Embedding layout; --tokenizer-dir gives it the Qwen3 tokenizer). The
BERT kinds get a small WordPiece tokenizer made here. `matryoshka` kinds
(suffix -mrl) also say is_matryoshka with matryoshka_dimensions [8, 16] in
config.json. minilm-mean-norm has the shape of all-MiniLM-L6-v2 (hidden 384, 6
layers, 512 positions; the small vocabulary), for benchmarks.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import zlib
from pathlib import Path

KINDS = ("bert-cls", "bert-cls-norm", "bert-mean", "bert-mean-norm", "bert-mean-norm-mrl", "xlm-roberta-mean-norm", "qwen3-last", "minilm-mean-norm")
_LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
_WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "is", "and", "of", "to", "in", "embedding", "model", "hello", "world"]


def _wordpiece_tokenizer(out: Path):
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + _LETTERS + ["##" + c for c in _LETTERS] + list("0123456789.,!?'")
    vocab += [w for w in _WORDS if w not in vocab]
    ids = {t: i for i, t in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])]
    )
    fast = transformers.BertTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]"
    )
    fast.save_pretrained(out)
    return len(vocab)


def _seeded(kind: str):
    import torch

    torch.manual_seed(zlib.crc32(kind.encode()))


def make_embedder(kind: str, out_dir: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
    import transformers
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer import modules as st_models
    except ImportError:  # before sentence-transformers 6
        from sentence_transformers import models as st_models

    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    out = Path(out_dir)
    hf = out.with_name(out.name + "-hf")
    hf.mkdir(parents=True, exist_ok=True)
    _seeded(kind)
    if kind.startswith("qwen3"):
        if tokenizer_dir is None:
            raise ValueError("qwen3-last needs --tokenizer-dir")
        shutil.copyfile(Path(tokenizer_dir) / "tokenizer.json", hf / "tokenizer.json")
        # An embedder encodes plain text: with a chat template, sentence-transformers would wrap each input as a chat message.
        tokenizer_config = json.loads((Path(tokenizer_dir) / "tokenizer_config.json").read_text())
        tokenizer_config.pop("chat_template", None)
        (hf / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
        config = transformers.Qwen3Config(
            vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, initializer_range=0.2,
        )
        model = transformers.Qwen3Model(config)
        pooling = "lasttoken"
        normalize = True
    else:
        vocab = _wordpiece_tokenizer(hf)
        common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=66, initializer_range=0.2)
        if kind.startswith("minilm"):
            common.update(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512)
        if kind.startswith("xlm-roberta"):
            model = transformers.XLMRobertaModel(transformers.XLMRobertaConfig(pad_token_id=0, **common))
        else:
            model = transformers.BertModel(transformers.BertConfig(**common))
        pooling = "cls" if kind.startswith("bert-cls") else "mean"
        normalize = "-norm" in kind
    model.save_pretrained(hf)
    transformer = st_models.Transformer(str(hf))
    dimension = getattr(transformer, "get_embedding_dimension", None) or transformer.get_word_embedding_dimension
    modules = [transformer, st_models.Pooling(dimension(), pooling_mode=pooling)]
    if normalize:
        modules.append(st_models.Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    shutil.rmtree(hf)
    if kind.endswith("-mrl"):
        path = out / "config.json"
        config = json.loads(path.read_text())
        config.update(is_matryoshka=True, matryoshka_dimensions=[8, 16])
        path.write_text(json.dumps(config, indent=2))
    return out


def st_encode(model_dir: str | Path, texts: list[str], batch_size: int = 32):
    """sentence-transformers' own embeddings (float32 [len(texts), dims])."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    return model.encode(texts, batch_size=batch_size, convert_to_numpy=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build")
    build.add_argument("--kind", required=True, choices=KINDS)
    build.add_argument("--out", required=True)
    build.add_argument("--tokenizer-dir")
    encode = sub.add_parser("encode", help="texts as a JSON list on stdin")
    encode.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    if args.command == "build":
        print(json.dumps({"model_dir": str(make_embedder(args.kind, args.out, args.tokenizer_dir))}))
    else:
        texts = json.load(sys.stdin)
        print(json.dumps({"embeddings": st_encode(args.model, texts).tolist()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
