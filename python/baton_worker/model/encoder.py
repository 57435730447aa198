"""Bidirectional encoders of the BERT family (BertModel, RobertaModel,
XLMRobertaModel, and their *ForSequenceClassification cross-encoders),
served as pooling models.

The forward pass runs every whole sequence of a step packed into one batch
of tokens: embeddings, projections and MLPs on the packed [T, hidden] rows,
and attention per bucket of sequences of similar length (lengths rounded up
to a power of two, so padding costs at most 2x), each bucket one SDPA call
over [sequences, heads, length, head_dim] with the padded keys masked. No KV
cache: a sequence attends to itself only, within the step.

Weights are the HF names of the base model (a checkpoint of a task model
keeps them under "bert." / "roberta.", which is stripped); an embedding
model's pooler layer is not used (sentence-transformers pools the last hidden
states itself). A cross-encoder's head (model/pooling.py ClassifierHead)
reads the CLS row: BERT's pooler then classifier, RoBERTa's classifier.dense
then classifier.out_proj. Its pair's second text is token type 1 (BERT's
segment embeddings; RoBERTa has one type): the tokens after the pair's first
separator (pooling.pair_separator), as the tokenizer's pair template types them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .config import ConfigError, read_json
from .pooling import ENCODER_ARCHITECTURES, ENCODER_CLASSIFIERS, ClassifierHead

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}
_PREFIXES = ("bert.", "roberta.")


@dataclass
class EncoderConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    # RoBERTa-style models number positions from pad_token_id + 1 (HF's create_position_ids_from_input_ids).
    position_offset: int
    torch_dtype: str | None = None

    @property
    def classifier(self) -> bool:
        return self.architecture in ENCODER_CLASSIFIERS

    @property
    def max_model_len(self) -> int:
        return self.max_position_embeddings - self.position_offset


def load_encoder_config(model_dir: Path) -> EncoderConfig:
    path = Path(model_dir) / "config.json"
    raw = read_json(path)
    architecture = (raw.get("architectures") or [None])[0]
    if architecture not in ENCODER_ARCHITECTURES:
        raise ConfigError(f"{path}: {architecture!r} is not an encoder; supported: {', '.join(ENCODER_ARCHITECTURES)}")
    act = raw.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise ConfigError(f"{path}: unsupported hidden_act {act!r}; supported: {', '.join(_ACTIVATIONS)}")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise ConfigError(f"{path}: position_embedding_type {raw['position_embedding_type']!r} is not supported (absolute only)")

    def need(key: str):
        if key not in raw:
            raise ConfigError(f"{path}: missing {key!r}")
        return raw[key]

    roberta = not architecture.startswith("Bert")
    return EncoderConfig(
        architecture=architecture,
        vocab_size=int(need("vocab_size")),
        hidden_size=int(need("hidden_size")),
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=int(need("num_attention_heads")),
        hidden_act=act,
        layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
        max_position_embeddings=int(need("max_position_embeddings")),
        position_offset=int(raw.get("pad_token_id", 1)) + 1 if roberta else 0,
        torch_dtype=raw.get("dtype") or raw.get("torch_dtype"),
    )


@dataclass
class _Layer:
    qkv: torch.Tensor
    qkv_bias: torch.Tensor
    out: torch.Tensor
    out_bias: torch.Tensor
    attn_norm: tuple[torch.Tensor, torch.Tensor]
    up: torch.Tensor
    up_bias: torch.Tensor
    down: torch.Tensor
    down_bias: torch.Tensor
    mlp_norm: tuple[torch.Tensor, torch.Tensor]


@dataclass
class _Bucket:
    index: torch.Tensor  # [P * L] packed token of each padded place (padding repeats the sequence's last token)
    keep: torch.Tensor  # [P, 1, 1, L] bool: real keys
    rows: int
    length: int
    dest: torch.Tensor | None  # packed token of each real place; None when nothing is padding
    real: torch.Tensor | None  # index of each real place among the P * L


class EncoderPlan:
    """A step's attention layout over its packed sequences, built once and read by every layer."""

    def __init__(self, query_start: np.ndarray):
        lengths = np.diff(query_start)
        self.num_tokens = int(query_start[-1])
        keys = np.left_shift(1, np.ceil(np.log2(np.maximum(lengths, 1))).astype(np.int64))
        self.buckets: list[_Bucket] = []
        for key in np.unique(keys):
            rows = np.flatnonzero(keys == key)
            lens = lengths[rows]
            width = int(lens.max())
            offset = np.minimum(np.arange(width)[None, :], lens[:, None] - 1)
            index = (query_start[rows][:, None] + offset).ravel()
            keep = np.arange(width)[None, :] < lens[:, None]
            dest = real = None
            if not keep.all():
                real = np.flatnonzero(keep.ravel())
                dest = index[real]
            as_tensor = lambda a: None if a is None else torch.from_numpy(a)  # noqa: E731
            self.buckets.append(_Bucket(torch.from_numpy(index), torch.from_numpy(keep)[:, None, None, :], len(rows), width, as_tensor(dest), as_tensor(real)))
        only = self.buckets[0] if len(self.buckets) == 1 else None
        # One bucket, no padding, rows in order: the bucket's output is the step's.
        self.direct = only is not None and only.real is None


class EncoderModel:
    def __init__(self, config: EncoderConfig, reader, device: torch.device):
        self.config = config
        self.device = device
        get = self._getter(reader)
        c = config
        self.word = get("embeddings.word_embeddings.weight")
        self.position = get("embeddings.position_embeddings.weight")
        # [types, hidden]: segment 0 for one text, 1 for a pair's second text.
        self.token_type = get("embeddings.token_type_embeddings.weight") if reader.has(self._name(reader, "embeddings.token_type_embeddings.weight")) else None
        self.classifier: ClassifierHead | None = None
        if c.classifier:
            roberta = not c.architecture.startswith("Bert")
            self.classifier = ClassifierHead.of(get, "classifier.out_proj", "classifier.dense") if roberta else ClassifierHead.of(get, "classifier", "pooler.dense")
        self.embed_norm = self._norm(get, "embeddings.LayerNorm")
        self.layers = []
        for i in range(c.num_layers):
            p = f"encoder.layer.{i}."
            a = p + "attention."
            self.layers.append(_Layer(
                qkv=torch.cat([get(a + f"self.{n}.weight") for n in ("query", "key", "value")]),
                qkv_bias=torch.cat([get(a + f"self.{n}.bias") for n in ("query", "key", "value")]),
                out=get(a + "output.dense.weight"),
                out_bias=get(a + "output.dense.bias"),
                attn_norm=self._norm(get, a + "output.LayerNorm"),
                up=get(p + "intermediate.dense.weight"),
                up_bias=get(p + "intermediate.dense.bias"),
                down=get(p + "output.dense.weight"),
                down_bias=get(p + "output.dense.bias"),
                mlp_norm=self._norm(get, p + "output.LayerNorm"),
            ))
        self.head_dim = c.hidden_size // c.num_heads
        self.act = _ACTIVATIONS[c.hidden_act]

    @staticmethod
    def _name(reader, name: str) -> str:
        for prefix in ("",) + _PREFIXES:
            if reader.has(prefix + name):
                return prefix + name
        return name

    def _getter(self, reader):
        def get(name: str) -> torch.Tensor:
            return reader.get(self._name(reader, name))

        return get

    @staticmethod
    def _norm(get, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
        return get(prefix + ".weight"), get(prefix + ".bias")

    def positions(self, query_start: np.ndarray) -> np.ndarray:
        """Each packed token's position id."""
        lengths = np.diff(query_start)
        return np.arange(int(query_start[-1])) - np.repeat(query_start[:-1], lengths) + self.config.position_offset

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, plan: EncoderPlan, token_types: torch.Tensor | None = None) -> torch.Tensor:
        """The last hidden states [T, hidden] of the packed sequences; token_types: each token's
        segment (None: every token is segment 0)."""
        c = self.config
        eps = c.layer_norm_eps
        x = F.embedding(input_ids, self.word) + F.embedding(positions, self.position)
        if self.token_type is not None:
            x = x + (self.token_type[0] if token_types is None else F.embedding(token_types, self.token_type))
        x = F.layer_norm(x, (c.hidden_size,), *self.embed_norm, eps)
        for layer in self.layers:
            q, k, v = F.linear(x, layer.qkv, layer.qkv_bias).split(c.hidden_size, dim=-1)
            attended = self._attention(q, k, v, plan)
            x = F.layer_norm(F.linear(attended, layer.out, layer.out_bias) + x, (c.hidden_size,), *layer.attn_norm, eps)
            h = self.act(F.linear(x, layer.up, layer.up_bias))
            x = F.layer_norm(F.linear(h, layer.down, layer.down_bias) + x, (c.hidden_size,), *layer.mlp_norm, eps)
        return x

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: EncoderPlan) -> torch.Tensor:
        heads, d = self.config.num_heads, self.head_dim
        out = None if plan.direct else torch.empty_like(q)
        for b in plan.buckets:
            def view(t: torch.Tensor) -> torch.Tensor:
                t = t if plan.direct else t.index_select(0, b.index)
                return t.view(b.rows, b.length, heads, d).transpose(1, 2)

            o = F.scaled_dot_product_attention(view(q), view(k), view(v), attn_mask=None if b.real is None else b.keep)
            o = o.transpose(1, 2).reshape(b.rows * b.length, heads * d)
            if plan.direct:
                return o
            if b.real is None:
                out.index_copy_(0, b.index, o)
            else:
                out.index_copy_(0, b.dest, o.index_select(0, b.real))
        return out
