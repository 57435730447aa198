"""Pooling models: which runner a directory gets, how its prompt becomes one
vector, and the pooling itself.

A sentence-transformers directory says it in modules.json: a Transformer
module at the directory's root (path ""), a Pooling module (its config.json:
pooling_mode "cls", "mean" or "lasttoken", or the older pooling_mode_*
booleans) and optionally Normalize. Any other module (Dense, ...) is refused
by name rather than served wrong. A directory without modules.json pools as
vLLM's defaults do: CLS for an encoder, the last token for a decoder, both
normalized. Matryoshka truncation is allowed as vLLM reads it from
config.json: is_matryoshka, or a non-empty matryoshka_dimensions (then only
those lengths).

A classifier (a cross-encoder, or a reranker) pools one row per prompt the
same way and then runs its classification head over it: the "vector" of a
classifier row is its logits (num_labels of them), and the activation the
score takes (sigmoid or identity) is read here and applied by the frontend.
BERT-family cross-encoders (`*ForSequenceClassification`) pool CLS into
their own head (BERT's pooler + classifier, RoBERTa's classification head:
both dense, tanh, out). A decoder served as a reranker through vLLM's
--hf-overrides (`Qwen3ForSequenceClassification`, `classifier_from_token`
["no", "yes"], `is_original_qwen3_reranker`) pools its last token after the
final norm, and its one logit is that row times lm_head[yes] - lm_head[no]:
sigmoid of it is softmax over [no, yes] taken at yes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..protocol import StepResult, StepTimings
from .config import ConfigError, read_json

# Bidirectional encoders: served by model/encoder.py, only as pooling models.
ENCODER_MODELS = ("BertModel", "XLMRobertaModel", "RobertaModel")
# Cross-encoders: an encoder with its sequence-classification head.
ENCODER_CLASSIFIERS = ("BertForSequenceClassification", "RobertaForSequenceClassification", "XLMRobertaForSequenceClassification")
ENCODER_ARCHITECTURES = ENCODER_MODELS + ENCODER_CLASSIFIERS
# Decoders served as classifiers (only through --hf-overrides, as vLLM serves Qwen3-Reranker).
DECODER_CLASSIFIERS = ("Qwen3ForSequenceClassification",)
HF_OVERRIDE_KEYS = ("architectures", "classifier_from_token", "is_original_qwen3_reranker")
# sentence-transformers' CrossEncoder activation_fn (a class path) -> ours.
_ST_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity"}
POOLING_TYPES = ("cls", "mean", "last")
# sentence-transformers' pooling_mode names -> ours.
_ST_MODES = {"cls": "cls", "mean": "mean", "lasttoken": "last"}
_ST_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "last"}


@dataclass
class PoolingConfig:
    pooling_type: str  # cls | mean | last
    normalize: bool
    dimensions: int
    is_matryoshka: bool = False
    matryoshka_dimensions: list[int] = field(default_factory=list)
    task: str = "embed"  # embed | classify (the rows are a classifier's logits)
    activation: str = "identity"  # classify: what turns a logit into a score (sigmoid | identity)


@dataclass
class ClassifierHead:
    """A classifier's head over pooled rows, float32: out(tanh(dense(x))) when
    there is a dense layer (BERT's pooler + classifier, RoBERTa's
    classification head), else out(x) (a reranker's token-difference row)."""

    out: torch.Tensor  # [num_labels, H]
    out_bias: torch.Tensor | None = None
    dense: torch.Tensor | None = None  # [H, H]
    dense_bias: torch.Tensor | None = None

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        if self.dense is not None:
            rows = torch.tanh(F.linear(rows, self.dense, self.dense_bias))
        return F.linear(rows, self.out, self.out_bias)

    @staticmethod
    def of(get, out: str, dense: str | None) -> "ClassifierHead":
        """From a checkpoint's tensors (get(name)), `out` and `dense` the layers' prefixes."""
        f32 = lambda name: get(name).float()  # noqa: E731
        return ClassifierHead(
            f32(out + ".weight"), f32(out + ".bias"),
            None if dense is None else f32(dense + ".weight"), None if dense is None else f32(dense + ".bias"),
        )


def resolve_runner(runner: str, model_dir: Path, architecture: str | None) -> str:
    """generate or pooling, from --runner (options.RUNNERS): auto picks pooling for a
    sentence-transformers directory or an encoder-only architecture (as vLLM's --runner auto)."""
    encoder = architecture in ENCODER_ARCHITECTURES
    if runner == "generate" and encoder:
        raise ConfigError(f"{architecture} is an encoder and cannot generate text; serve it with --runner pooling")
    if runner == "generate" and architecture in DECODER_CLASSIFIERS:
        raise ConfigError(f"{architecture} is a classifier and generates no text; serve it with --runner pooling")
    if runner != "auto":
        return runner
    classifier = architecture in DECODER_CLASSIFIERS
    return "pooling" if encoder or classifier or (model_dir / "modules.json").is_file() else "generate"


def overridden_architecture(architecture: str | None, overrides: dict) -> str | None:
    """config.json's architecture as --hf-overrides restates it (vLLM's flag; only the keys that
    serve a decoder as a reranker are taken, and a decoder classifier needs all of them)."""
    unknown = sorted(set(overrides) - set(HF_OVERRIDE_KEYS))
    if unknown:
        raise ConfigError(f"--hf-overrides: {', '.join(unknown)} not supported; supported: {', '.join(HF_OVERRIDE_KEYS)}")
    names = overrides.get("architectures")
    if names is None:
        if overrides:
            raise ConfigError("--hf-overrides: classifier_from_token and is_original_qwen3_reranker go with architectures")
        return architecture
    if not (isinstance(names, list) and len(names) == 1 and names[0] in DECODER_CLASSIFIERS):
        raise ConfigError(f"--hf-overrides: architectures must be one of {list(DECODER_CLASSIFIERS)}, got {names!r}")
    tokens = overrides.get("classifier_from_token")
    if not (isinstance(tokens, list) and len(tokens) == 2 and all(isinstance(t, str) for t in tokens)) or overrides.get("is_original_qwen3_reranker") is not True:
        raise ConfigError(
            f"--hf-overrides: {names[0]} is served as Qwen3-Reranker: classifier_from_token must be two tokens "
            '(["no", "yes"]) and is_original_qwen3_reranker true'
        )
    return names[0]


def read_classifier_config(model_dir: Path, pooling_type: str, num_labels: int | None = None) -> PoolingConfig:
    """A classifier's rows: `pooling_type` (where its head reads), num_labels logits (config.json's
    id2label unless given), and the score's activation as sentence-transformers' CrossEncoder and
    vLLM choose it: config.json's sentence_transformers.activation_fn (or the older
    sbert_ce_default_activation_function), else sigmoid for one label. Only one label is served
    (a score per pair)."""
    path = Path(model_dir) / "config.json"
    config = read_json(path)
    if num_labels is None:
        labels = config.get("id2label")
        num_labels = len(labels) if isinstance(labels, dict) and labels else int(config.get("num_labels", 2))
    if num_labels != 1:
        raise ConfigError(f"{path}: a classifier with {num_labels} labels; /score and /rerank serve one label (a relevance score)")
    name = (config.get("sentence_transformers") or {}).get("activation_fn") or config.get("sbert_ce_default_activation_function")
    activation = "sigmoid"
    if name is not None:
        activation = _ST_ACTIVATIONS.get(str(name).rsplit(".", 1)[-1])
        if activation is None:
            raise ConfigError(f"{path}: activation_fn {name!r} is not supported; supported: torch.nn Sigmoid, Identity")
    return PoolingConfig(pooling_type, False, num_labels, task="classify", activation=activation)


def vocabulary_id(model_dir: Path, token: str) -> int:
    """A token's id in the directory's tokenizer.json (its vocabulary or its added tokens)."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"{model_dir}: no tokenizer.json to find the classifier token {token!r} in")
    raw = read_json(path)
    for added in raw.get("added_tokens") or []:
        if added.get("content") == token:
            return int(added["id"])
    vocab = (raw.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and token in vocab:
        return int(vocab[token])
    raise ConfigError(f"{path}: the classifier token {token!r} is not in the vocabulary")


def pair_separator(model_dir: Path) -> int | None:
    """The token that ends a pair's first text, where its second text's segment (type id 1)
    begins, as tokenizer.json's post-processor builds a pair (BERT: [CLS] A [SEP] B [SEP]);
    None when the pair has no second segment."""
    path = Path(model_dir) / "tokenizer.json"
    processor = (read_json(path).get("post_processor") or {}) if path.is_file() else {}
    if processor.get("type") == "BertProcessing":
        return int(processor["sep"][1])
    if processor.get("type") != "TemplateProcessing":
        return None
    pair = processor.get("pair") or []
    for i, piece in enumerate(pair):
        sequence = piece.get("Sequence")
        if sequence is not None and sequence.get("id") == "B":
            before = pair[i - 1].get("SpecialToken") if i > 0 else None
            if sequence.get("type_id", 0) == 0 or before is None:
                return None
            return int(processor["special_tokens"][before["id"]]["ids"][0])
    return None


def _module_kind(entry: dict) -> str:
    # "sentence_transformers.models.Pooling" (v2-v5) or "...modules.pooling.Pooling" (v6): the class name decides.
    return str(entry.get("type", "")).rsplit(".", 1)[-1]


def _st_pooling_type(path: Path) -> str:
    raw = read_json(path)
    mode = raw.get("pooling_mode")
    if mode is not None:
        modes = [mode] if isinstance(mode, str) else list(mode)
    else:
        modes = [name for key, name in _ST_FLAGS.items() if raw.get(key)]
        modes += [key for key in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens") if raw.get(key)]
    if len(modes) != 1:
        raise ConfigError(f"{path}: pooling mode {modes!r}; one of cls, mean, lasttoken is supported")
    if modes[0] not in _ST_MODES and modes[0] not in _ST_FLAGS.values():
        raise ConfigError(f"{path}: pooling mode {modes[0]!r} is not supported; supported: cls, mean, lasttoken")
    return _ST_MODES.get(modes[0], modes[0])


def read_pooling_config(model_dir: Path, hidden_size: int, encoder: bool) -> PoolingConfig:
    """How the directory's model pools (see the module docstring)."""
    model_dir = Path(model_dir)
    config = read_json(model_dir / "config.json")
    dims = config.get("matryoshka_dimensions") or []
    if not isinstance(dims, list) or not all(isinstance(d, int) and 0 < d <= hidden_size for d in dims):
        raise ConfigError(f"{model_dir / 'config.json'}: matryoshka_dimensions must be a list of lengths in [1, {hidden_size}]")
    matryoshka = dict(is_matryoshka=bool(config.get("is_matryoshka")) or bool(dims), matryoshka_dimensions=sorted(dims))
    modules_path = model_dir / "modules.json"
    if not modules_path.is_file():
        return PoolingConfig("cls" if encoder else "last", True, hidden_size, **matryoshka)
    modules = read_json(modules_path)
    if not isinstance(modules, list):
        raise ConfigError(f"{modules_path} must be a list of modules")
    pooling_type, normalize = None, False
    for entry in modules:
        kind = _module_kind(entry)
        path = str(entry.get("path", ""))
        if kind == "Transformer":
            if path not in ("", "."):
                raise ConfigError(f"{modules_path}: the Transformer module must be the directory itself, not {path!r}")
        elif kind == "Pooling":
            pooling_type = _st_pooling_type(model_dir / path / "config.json")
        elif kind == "Normalize":
            normalize = True
        else:
            raise ConfigError(f"{modules_path}: module {kind or entry} is not supported; supported: Transformer, Pooling, Normalize")
    if pooling_type is None:
        raise ConfigError(f"{modules_path} has no Pooling module")
    return PoolingConfig(pooling_type, normalize, hidden_size, **matryoshka)


def pool_rows(hidden: torch.Tensor, query_start: np.ndarray, pooling_type: str) -> torch.Tensor:
    """One vector per row of whole sequences packed in `hidden` [T, H]; row r
    is hidden[query_start[r] : query_start[r + 1]]. float32 [R, H]."""
    starts = torch.from_numpy(query_start[:-1]).to(hidden.device)
    if pooling_type == "cls":
        return hidden.index_select(0, starts).float()
    if pooling_type == "last":
        return hidden.index_select(0, torch.from_numpy(query_start[1:] - 1).to(hidden.device)).float()
    return segment_sums(hidden, query_start) / torch.from_numpy(np.diff(query_start)).to(hidden.device, torch.float32)[:, None]


def segment_sums(hidden: torch.Tensor, query_start: np.ndarray) -> torch.Tensor:
    """float32 [R, H]: the sum of each row's hidden vectors (one index_add over every token)."""
    rows = len(query_start) - 1
    owner = torch.from_numpy(np.repeat(np.arange(rows), np.diff(query_start))).to(hidden.device)
    out = torch.zeros(rows, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    return out.index_add_(0, owner, hidden.float())


def finish_vectors(vectors: torch.Tensor, normalize: bool, head: ClassifierHead | None = None) -> np.ndarray:
    """float32 [R, H] on the host, L2-normalized as sentence-transformers' Normalize does;
    a classifier's: its logits [R, num_labels] (the activation is the frontend's)."""
    if head is not None:
        return head(vectors.float()).float().cpu().numpy()
    if normalize:
        vectors = F.normalize(vectors, p=2, dim=1)
    return vectors.float().cpu().numpy()


class ChunkPooler:
    """Pooling over a causal decoder whose prompts may run in chunks (prefill
    across steps): mean and cls keep each slot's partial result between its
    chunks; last needs only the row that ends the prompt. `hidden` rows are
    the last hidden states (after the final norm) of the step's packed tokens."""

    def __init__(self, config: PoolingConfig, head: ClassifierHead | None = None):
        self.config = config
        self.head = head
        self.partial: dict[int, torch.Tensor] = {}  # slot -> float32 [H]: sum (mean) or first row (cls) so far

    def step(self, hidden: torch.Tensor, slots: np.ndarray, start: np.ndarray, num_new: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """float32 [rows ending their prompt (ends), H]: their vectors, in row order."""
        kind = self.config.pooling_type
        query_start = np.zeros(len(slots) + 1, np.int64)
        np.cumsum(num_new, out=query_start[1:])
        if kind == "last":
            return finish_vectors(hidden.index_select(0, torch.from_numpy(query_start[1:][ends] - 1).to(hidden.device)).float(), self.config.normalize, self.head)
        if kind == "mean":
            parts = segment_sums(hidden, query_start)
        else:
            # cls: the row of position 0, in the chunk that starts the prompt.
            parts = hidden.index_select(0, torch.from_numpy(query_start[:-1]).to(hidden.device)).float()
        # Rows that are a whole prompt need no partial; the others start, continue or end one.
        whole = (start == 0) & ends
        for i in np.flatnonzero(~whole).tolist():
            slot = int(slots[i])
            if start[i] == 0:
                self.partial[slot] = parts[i].clone()
            elif kind == "mean":
                parts[i] += self.partial[slot]
            else:
                parts[i] = self.partial[slot]
            if ends[i]:
                self.partial.pop(slot, None)
            else:
                self.partial[slot] = parts[i].clone()
        vectors = parts[torch.from_numpy(np.flatnonzero(ends)).to(parts.device)]
        if kind == "mean":
            counts = (start + num_new)[ends]
            vectors = vectors / torch.from_numpy(counts).to(vectors.device, torch.float32)[:, None]
        return finish_vectors(vectors, self.config.normalize, self.head)

    def drop(self, slot: int) -> None:
        self.partial.pop(slot, None)


def pooled_result(step_id: int, req_ids: np.ndarray, pooled: np.ndarray | None, t0: float, t1: float, t2: float) -> StepResult:
    """A pooling step's answer: the vectors of the rows that ended a prompt (req_ids), nothing sampled."""
    empty = np.zeros(0, np.int32)
    return StepResult(
        step_id=step_id,
        req_ids=req_ids.astype(np.int32),
        token_ids=empty,
        logprobs=None,
        top_counts=None,
        top_ids=None,
        top_logprobs=None,
        timings=StepTimings((t1 - t0) * 1e3, (t2 - t1) * 1e3, 0.0),
        pooled=pooled,
    )
