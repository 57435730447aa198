"""Random-weight embedding models for the pooling parity tests, built the way
a user's directory is: transformers' own classes, saved by
sentence-transformers' own SentenceTransformer(modules=[...]).save(dir).
Cross-encoders and rerankers too: transformers' classes and save_pretrained.

Library:  make_embedder(kind, out_dir) -> Path;  st_encode(model_dir, texts) -> np.ndarray
          make_scorer(kind, out_dir) -> Path;  reference_scores(model_dir, pairs) -> list[float]
CLI:      python python/tests/random_embedders.py build --kind bert-cls --out DIR
          python python/tests/random_embedders.py encode --model DIR < texts.json  (prints {"embeddings": [[...]]})
          python python/tests/random_embedders.py score --model DIR < pairs.json  (prints {"scores": [...]})

Scorer kinds: bert-cross (BertForSequenceClassification, one label),
xlm-roberta-cross (XLMRobertaForSequenceClassification, one label) and
qwen3-reranker (a Qwen3ForCausalLM, served as Qwen3-Reranker with
--hf-overrides). Their references: sentence-transformers' CrossEncoder
predict (sigmoid of the logit) for the cross-encoders; for the reranker
transformers' own forward on tokenizer(text_1, text_2) and sigmoid(logit[yes]
- logit[no]) at the last position.

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
SCORER_KINDS = ("bert-cross", "xlm-roberta-cross", "qwen3-reranker")
# Qwen3-Reranker's overrides, as vLLM's docs serve it.
QWEN3_RERANKER_OVERRIDES = {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": True}
_LETTERS = [chr(c) for c in range(ord("a"), ord("z") + 1)]
_WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "is", "and", "of", "to", "in", "embedding", "model", "hello", "world"]


def _wordpiece_tokenizer(out: Path, roberta_pairs: bool = False):
    """roberta_pairs: a pair is "[CLS] A [SEP] [SEP] B [SEP]", every token type 0 (RoBERTa's template)."""
    import transformers
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + _LETTERS + ["##" + c for c in _LETTERS] + list("0123456789.,!?'")
    vocab += [w for w in _WORDS if w not in vocab]
    ids = {t: i for i, t in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] [SEP] $B [SEP]" if roberta_pairs else "[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])]
    )
    # BertTokenizerFast would rebuild BERT's own pair template; the generic class keeps tokenizer.json's.
    cls = transformers.PreTrainedTokenizerFast if roberta_pairs else transformers.BertTokenizerFast
    fast = cls(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    fast.save_pretrained(out)
    return len(vocab)


def _qwen3_tokenizer(tokenizer_dir: str | Path | None, out: Path) -> None:
    if tokenizer_dir is None:
        raise ValueError("the qwen3 kinds need --tokenizer-dir")
    shutil.copyfile(Path(tokenizer_dir) / "tokenizer.json", out / "tokenizer.json")
    # Plain text in: with a chat template, sentence-transformers would wrap each input as a chat message.
    tokenizer_config = json.loads((Path(tokenizer_dir) / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))


def _qwen3_config():
    import transformers

    return transformers.Qwen3Config(
        vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, initializer_range=0.2,
    )


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
        _qwen3_tokenizer(tokenizer_dir, hf)
        model = transformers.Qwen3Model(_qwen3_config())
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


def make_scorer(kind: str, out_dir: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
    """A random-weight cross-encoder or reranker directory (SCORER_KINDS), saved by transformers."""
    import transformers

    if kind not in SCORER_KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(SCORER_KINDS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _seeded(kind)
    if kind == "qwen3-reranker":
        _qwen3_tokenizer(tokenizer_dir, out)
        model = transformers.Qwen3ForCausalLM(_qwen3_config())
    else:
        vocab = _wordpiece_tokenizer(out, roberta_pairs=kind == "xlm-roberta-cross")
        # 34 positions: long pairs meet the model's length in the tests.
        common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      initializer_range=0.2, num_labels=1)
        if kind == "bert-cross":
            model = transformers.BertForSequenceClassification(transformers.BertConfig(max_position_embeddings=34, **common))
        else:
            # RoBERTa's positions start at pad_token_id + 1: 36 positions hold 34 tokens; one token type, as XLM-R's checkpoints.
            config = transformers.XLMRobertaConfig(pad_token_id=0, max_position_embeddings=36, type_vocab_size=1, **common)
            model = transformers.XLMRobertaForSequenceClassification(config)
    model.save_pretrained(out)
    return out


def reference_scores(model_dir: str | Path, pairs: list[list[str]], max_length: int | None = None) -> list[float]:
    """The scores of (text_1, text_2) pairs as the model's own libraries give them (see the module
    docstring); max_length: each pair cut to that many tokens by the tokenizer's truncation."""
    import torch

    config = json.loads((Path(model_dir) / "config.json").read_text())
    if config["architectures"][0] != "Qwen3ForCausalLM":
        from sentence_transformers import CrossEncoder

        return CrossEncoder(str(model_dir), device="cpu", max_length=max_length).predict([tuple(p) for p in pairs], batch_size=8).tolist()
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.Qwen3ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    no, yes = tokenizer.convert_tokens_to_ids(QWEN3_RERANKER_OVERRIDES["classifier_from_token"])
    scores = []
    with torch.inference_mode():
        for text_1, text_2 in pairs:
            ids = tokenizer(text_1, text_2, return_tensors="pt", truncation=max_length is not None, max_length=max_length)["input_ids"]
            last = model(input_ids=ids).logits[0, -1]
            scores.append(torch.sigmoid(last[yes] - last[no]).item())
    return scores


def prepare(jobs: list[dict]) -> list[dict]:
    """Each job {kind, out, tokenizer_dir?, encode?: texts, score?: [{pairs, max_length?}]} built, then its
    references: {embeddings} for encode, {scores: one list per score entry}. One process for a test file's
    models pays the libraries' import once."""
    results = []
    for job in jobs:
        make = make_scorer if job["kind"] in SCORER_KINDS else make_embedder
        out = make(job["kind"], job["out"], job.get("tokenizer_dir"))
        result: dict = {"model_dir": str(out)}
        if "encode" in job:
            result["embeddings"] = st_encode(out, job["encode"]).tolist()
        if "score" in job:
            result["scores"] = [reference_scores(out, entry["pairs"], entry.get("max_length")) for entry in job["score"]]
        results.append(result)
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build")
    build.add_argument("--kind", required=True, choices=KINDS + SCORER_KINDS)
    build.add_argument("--out", required=True)
    build.add_argument("--tokenizer-dir")
    encode = sub.add_parser("encode", help="texts as a JSON list on stdin")
    encode.add_argument("--model", required=True)
    score = sub.add_parser("score", help="[text_1, text_2] pairs as a JSON list on stdin")
    score.add_argument("--model", required=True)
    score.add_argument("--max-length", type=int)
    sub.add_parser("prepare", help="jobs as a JSON list on stdin; one process builds every directory and its references")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        print(json.dumps(prepare(json.load(sys.stdin))))
    elif args.command == "build":
        make = make_scorer if args.kind in SCORER_KINDS else make_embedder
        print(json.dumps({"model_dir": str(make(args.kind, args.out, args.tokenizer_dir))}))
    elif args.command == "score":
        print(json.dumps({"scores": reference_scores(args.model, json.load(sys.stdin), args.max_length)}))
    else:
        texts = json.load(sys.stdin)
        print(json.dumps({"embeddings": st_encode(args.model, texts).tolist()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
