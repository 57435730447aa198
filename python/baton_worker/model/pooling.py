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
ENCODER_ARCHITECTURES = ("BertModel", "XLMRobertaModel", "RobertaModel")
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


def resolve_runner(runner: str, model_dir: Path, architecture: str | None) -> str:
    """generate or pooling, from --runner (options.RUNNERS): auto picks pooling for a
    sentence-transformers directory or an encoder-only architecture (as vLLM's --runner auto)."""
    encoder = architecture in ENCODER_ARCHITECTURES
    if runner == "generate" and encoder:
        raise ConfigError(f"{architecture} is an encoder and cannot generate text; serve it with --runner pooling")
    if runner != "auto":
        return runner
    return "pooling" if encoder or (model_dir / "modules.json").is_file() else "generate"


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


def finish_vectors(vectors: torch.Tensor, normalize: bool) -> np.ndarray:
    """float32 [R, H] on the host, L2-normalized as sentence-transformers' Normalize does."""
    if normalize:
        vectors = F.normalize(vectors, p=2, dim=1)
    return vectors.float().cpu().numpy()


class ChunkPooler:
    """Pooling over a causal decoder whose prompts may run in chunks (prefill
    across steps): mean and cls keep each slot's partial result between its
    chunks; last needs only the row that ends the prompt. `hidden` rows are
    the last hidden states (after the final norm) of the step's packed tokens."""

    def __init__(self, config: PoolingConfig):
        self.config = config
        self.partial: dict[int, torch.Tensor] = {}  # slot -> float32 [H]: sum (mean) or first row (cls) so far

    def step(self, hidden: torch.Tensor, slots: np.ndarray, start: np.ndarray, num_new: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """float32 [rows ending their prompt (ends), H]: their vectors, in row order."""
        kind = self.config.pooling_type
        query_start = np.zeros(len(slots) + 1, np.int64)
        np.cumsum(num_new, out=query_start[1:])
        if kind == "last":
            return finish_vectors(hidden.index_select(0, torch.from_numpy(query_start[1:][ends] - 1).to(hidden.device)).float(), self.config.normalize)
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
        return finish_vectors(vectors, self.config.normalize)

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
