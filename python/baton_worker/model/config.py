"""Model configuration read from an HF model directory's config.json.

Only what the decoder needs is kept, normalised across the supported families
and across transformers versions (rope settings live in `rope_parameters` in
transformers 5 configs and in `rope_theta` + `rope_scaling` in older files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..models import GRAPH_ARCHITECTURES  # directories the worker loads as graph models instead (loading.py)

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Qwen2MoeForCausalLM",
)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# A decoder saved as its base model (an embedding model: sentence-transformers
# saves Qwen3Model, with no lm_head) is the same decoder.
BASE_MODEL_ARCHITECTURES = {
    "LlamaModel": "LlamaForCausalLM",
    "MistralModel": "MistralForCausalLM",
    "Qwen2Model": "Qwen2ForCausalLM",
    "Qwen3Model": "Qwen3ForCausalLM",
    "Qwen3MoeModel": "Qwen3MoeForCausalLM",
    "Qwen2MoeModel": "Qwen2MoeForCausalLM",
}
# Mixture-of-experts architectures (ModelConfig.moe).
_MOE = ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM")
# Architectures whose q and k are RMS-normed per head before the rotation.
_QK_NORM = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


class ConfigError(Exception):
    """The model directory cannot be served; the message names the cause."""


@dataclass
class RopeConfig:
    rope_type: str = "default"
    theta: float = 10000.0
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    partial_rotary_factor: float = 1.0
    # Multimodal rotary (Qwen2-VL family): the rotary half-dimensions taken from the (t, h, w) position streams, in turn.
    mrope_section: tuple[int, ...] | None = None
    # Qwen3-Omni / Qwen3-VL: the streams interleaved (frequency i from stream i % 3 within their sections) instead.
    mrope_interleaved: bool = False


@dataclass(frozen=True)
class MoeConfig:
    """A mixture-of-experts MLP (Qwen3-MoE): each token's router picks top_k of num_experts experts, each
    a SiLU MLP of intermediate_size, and sums their outputs weighted by the router's probabilities."""

    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool  # the top_k probabilities renormalized to sum to 1
    sparse_layers: tuple[bool, ...]  # per layer: experts (True) or the dense MLP (mlp_only_layers)
    # Qwen2-MoE: a shared expert every token goes through, scaled by a sigmoid gate (0: none).
    shared_intermediate_size: int = 0


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    rope: RopeConfig
    # Per layer: the sliding window size, or None for full attention.
    sliding_windows: list[int | None] = field(default_factory=list)
    torch_dtype: str | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    # Mixture-of-experts layers (None: every layer's MLP is dense).
    moe: MoeConfig | None = None


def read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path} not found") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from None


def _rope_config(raw: dict) -> RopeConfig:
    # transformers 5: rope_parameters holds everything, theta included.
    params = dict(raw.get("rope_parameters") or {})
    # Older files: rope_theta at top level, optional rope_scaling dict.
    if not params:
        params = dict(raw.get("rope_scaling") or {})
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "mrope":  # older Qwen2-VL files: the default frequencies, split by mrope_section
        rope_type = "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(f"unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    return RopeConfig(
        rope_type=rope_type,
        theta=float(params.get("rope_theta", raw.get("rope_theta", 10000.0))),
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=params.get("original_max_position_embeddings"),
        partial_rotary_factor=float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))),
        mrope_section=tuple(int(s) for s in params["mrope_section"]) if params.get("mrope_section") else None,
        mrope_interleaved=bool(params.get("interleaved") or params.get("mrope_interleaved")),
    )


def _sliding_windows(raw: dict, architecture: str, num_layers: int) -> list[int | None]:
    window = raw.get("sliding_window")
    layer_types = raw.get("layer_types")
    if layer_types:
        return [window if kind == "sliding_attention" else None for kind in layer_types]
    if architecture == "MistralForCausalLM":
        return [window] * num_layers
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", *_MOE) and raw.get("use_sliding_window") and window:
        # HF: layers from max_window_layers on use the window.
        first = raw.get("max_window_layers", num_layers)
        return [window if i >= first else None for i in range(num_layers)]
    return [None] * num_layers


def _eos_ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def stack_config(raw: dict, what: str, architecture: str, *, qk_norm: bool, rms_norm_eps: float,
                 max_positions: int, mlp_bias: bool = False) -> ModelConfig:
    """A SiLU decoder stack inside a composite model's config (CSM's backbone and depth decoder, Qwen3-Omni's
    talker and code predictor) as a ModelConfig; missing fields take the model's defaults given here, and
    attention_bias covers q, k, v and o alike. `what` names the config section in errors."""
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{what}: unsupported hidden_act {raw['hidden_act']!r}; supported: silu")
    try:
        hidden, heads, layers = int(raw["hidden_size"]), int(raw["num_attention_heads"]), int(raw["num_hidden_layers"])
        intermediate, vocab = int(raw["intermediate_size"]), int(raw["vocab_size"])
    except KeyError as missing:
        raise ConfigError(f"{what}: missing {missing}") from None
    bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        architecture=architecture,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", rms_norm_eps)),
        max_position_embeddings=int(raw.get("max_position_embeddings", max_positions)),
        tie_word_embeddings=False,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=mlp_bias,
        qk_norm=qk_norm,
        rope=_rope_config(raw),
        sliding_windows=[None] * layers,
        torch_dtype=raw.get("dtype") or raw.get("torch_dtype"),
        eos_token_ids=[],
    )


def _require(raw: dict, key: str, path: Path):
    if key not in raw:
        raise ConfigError(f"{path}: missing {key!r}")
    return raw[key]


# A composite model's text_config names its decoder by model_type (and often no architectures).
TEXT_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_omni_moe_text": "Qwen3MoeForCausalLM",  # Qwen3-Omni's thinker: Qwen3-MoE with multimodal rotary positions
    "qwen2_5_vl_text": "Qwen2ForCausalLM",  # Qwen2.5-VL's language model: Qwen2 with multimodal rotary positions
}


def load_model_config(model_dir: Path, *, lenient: bool = False, text_config: str | None = None) -> ModelConfig:
    """Reads config.json (+ generation_config.json for EOS ids).

    lenient: fill missing shape fields with small defaults; used by the
    dummy-null load format, which only needs vocab_size.
    text_config: the key of config.json holding the decoder's own config (a
    vision-language model's "text_config", or a dotted path to a nested one);
    its architecture may be named by model_type alone.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ConfigError(f"model directory {model_dir} does not exist")
    path = model_dir / "config.json"
    raw = read_json(path)
    if text_config is not None:
        # A dotted key reaches a nested object (Qwen3-Omni: thinker_config.text_config).
        for key in text_config.split("."):
            raw = raw.get(key) if isinstance(raw, dict) else None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path} has no {text_config} object")
        if not raw.get("architectures") and raw.get("model_type") in TEXT_MODEL_TYPES:
            raw = {**raw, "architectures": [TEXT_MODEL_TYPES[raw["model_type"]]]}
    architectures = raw.get("architectures") or []
    architecture = architectures[0] if architectures else None
    architecture = BASE_MODEL_ARCHITECTURES.get(architecture, architecture)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}; "
            f"graph models: {', '.join(GRAPH_ARCHITECTURES)}"
        )

    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"unsupported hidden_act {raw['hidden_act']!r}; supported: silu")

    def get(key: str, default):
        return raw.get(key, default) if lenient else _require(raw, key, path)

    hidden_size = int(get("hidden_size", 64))
    num_heads = int(get("num_attention_heads", 4))
    num_layers = int(get("num_hidden_layers", 2))
    head_dim = raw.get("head_dim") or hidden_size // num_heads
    qwen2 = architecture == "Qwen2ForCausalLM"
    qwen2_moe = architecture == "Qwen2MoeForCausalLM"
    generation = model_dir / "generation_config.json"
    eos = _eos_ids(read_json(generation).get("eos_token_id")) if generation.exists() else []
    return ModelConfig(
        architecture=architecture,
        vocab_size=int(_require(raw, "vocab_size", path)),
        hidden_size=hidden_size,
        intermediate_size=int(get("intermediate_size", 4 * hidden_size)),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        # Qwen2 always has q/k/v bias; Llama-style configs say so with attention_bias.
        qkv_bias=qwen2 or (qwen2_moe and bool(raw.get("qkv_bias", True))) or bool(raw.get("attention_bias", False)),
        o_bias=(not qwen2) and (not qwen2_moe) and bool(raw.get("attention_bias", False)),
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=architecture in _QK_NORM,
        rope=_rope_config(raw),
        sliding_windows=_sliding_windows(raw, architecture, num_layers),
        torch_dtype=raw.get("dtype") or raw.get("torch_dtype"),
        eos_token_ids=eos or _eos_ids(raw.get("eos_token_id")),
        moe=_moe_config(raw, path, num_layers) if architecture in _MOE else None,
    )


def _moe_config(raw: dict, path: Path, num_layers: int) -> MoeConfig | None:
    """Qwen3MoeConfig's and Qwen2MoeConfig's fields (num_experts is also saved as num_local_experts); None when it has
    no experts."""
    experts = int(raw.get("num_experts") or raw.get("num_local_experts") or 0)
    if experts <= 0:
        return None
    step = int(raw.get("decoder_sparse_step", 1))
    dense = {int(i) for i in raw.get("mlp_only_layers") or []}
    top_k = int(_require(raw, "num_experts_per_tok", path))
    if not 1 <= top_k <= experts:
        raise ConfigError(f"{path}: num_experts_per_tok {top_k} must be in [1, {experts}]")
    if step < 1:
        raise ConfigError(f"{path}: decoder_sparse_step must be >= 1, got {step}")
    return MoeConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=int(_require(raw, "moe_intermediate_size", path)),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        # Qwen3MoeDecoderLayer: experts where the layer is not MLP-only and (i + 1) % decoder_sparse_step == 0.
        sparse_layers=tuple(i not in dense and (i + 1) % step == 0 for i in range(num_layers)),
        shared_intermediate_size=int(raw.get("shared_expert_intermediate_size") or 0),
    )
