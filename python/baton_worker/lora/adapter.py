"""A PEFT LoRA adapter directory, read and checked against the base model.

adapter_config.json says which projections the adapter targets and how it
scales (r, lora_alpha, use_rslora, rank_pattern / alpha_pattern);
adapter_model.safetensors (or adapter_model.bin) holds lora_A [r, in] and
lora_B [out, r] per targeted module, keyed by the module's name in the HF
model (base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight).
Targets are matched as PEFT matches them (a list: the name or a dotted
suffix of it, narrowed by layers_to_transform; a string: a regex that must
match the whole name), so the adapter computes here what PeftModel computes:
y = W x + scaling * B A x.

Only what the decoder can apply is accepted: the seven projections of a
Llama-family layer, plain LoRA. Everything else (DoRA, trained biases,
modules_to_save, extra trainable tokens, other LoRA variants, a rank above
--max-lora-rank, a shape or layer count of another model) is refused with
one line that names the problem, raised as LoraLoadError.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..model.config import ModelConfig

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
# The projections as the decoder multiplies them: q/k/v and gate/up fused (one output each), or one by one.
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
UNFUSED_GROUPS = tuple((m,) for m in MODULES)
# Modules of the model that PEFT could adapt but the decoder does not apply LoRA to.
_OTHER_MODULES = ("lm_head", "embed_tokens")

CONFIG_FILE = "adapter_config.json"
SAFETENSORS_FILE = "adapter_model.safetensors"
BIN_FILE = "adapter_model.bin"

# adapter_config.json keys that, when set, make the adapter compute something
# other than plain LoRA on the projections (or train other parts of the model).
_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora)",
    "lora_bias": "a bias on lora_B (lora_bias)",
    "modules_to_save": "modules_to_save",
    "trainable_token_indices": "trainable_token_indices",
    "target_parameters": "target_parameters",
    "layer_replication": "layer_replication",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "use_qalora": "QA-LoRA (use_qalora)",
    "use_bdlora": "BD-LoRA (use_bdlora)",
    "arrow_config": "Arrow routing (arrow_config)",
    "kasa_config": "KaSA (kasa_config)",
    "velora_config": "VeLoRA (velora_config)",
    "monteclora_config": "MonteCLoRA (monteclora_config)",
}

_WEIGHT_KEY = re.compile(
    r"base_model\.model\.(?P<prefix>(?:model\.)?)layers\.(?P<layer>\d+)\.(?P<parent>self_attn|mlp)\.(?P<module>\w+)\.lora_(?P<ab>[AB])\.weight"
)


class LoraLoadError(Exception):
    """The adapter cannot be served; the message names the problem (one line)."""


@dataclass
class LoraLayout:
    """What an adapter must fit: the base model's projections and how the decoder groups them."""

    architecture: str
    num_layers: int
    shapes: dict[str, tuple[int, int]]  # module -> (in features, out features)
    groups: tuple[tuple[str, ...], ...] = FUSED_GROUPS

    @staticmethod
    def of(config: ModelConfig, fused: bool = True) -> LoraLayout:
        h, q, kv, i = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim, config.intermediate_size
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                  "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
        return LoraLayout(config.architecture, config.num_layers, shapes, FUSED_GROUPS if fused else UNFUSED_GROUPS)

    def bounds(self, group: int) -> list[int]:
        """The group's output offsets: module m of the group writes columns [bounds[m], bounds[m + 1])."""
        out = [0]
        for module in self.groups[group]:
            out.append(out[-1] + self.shapes[module][1])
        return out

    def in_features(self, group: int) -> int:
        return self.shapes[self.groups[group][0]][0]


@dataclass
class LoraAdapter:
    lora_id: int
    name: str
    path: str
    rank: int  # the largest rank of its modules
    # weights[layer][module] = (A [r, in], B [out, r] with the scaling folded in); modules it leaves alone are absent.
    weights: list[dict[str, tuple[torch.Tensor, torch.Tensor]]]
    present: np.ndarray  # bool [layers, groups]: some module of the group has weights
    # The torch path's weights per layer per group (grouped()), made once when first needed.
    groups: list[list[tuple[torch.Tensor, torch.Tensor] | None]] | None = field(default=None, repr=False)

    def grouped(self, layout: LoraLayout) -> list[list[tuple[torch.Tensor, torch.Tensor] | None]]:
        """Per layer per group: (A of the group's modules stacked [sum r, in], B block-diagonal
        [group's out, sum r]), so a fused projection takes one matrix multiply pair per adapter;
        None where the adapter leaves the whole group alone."""
        if self.groups is None:
            self.groups = [[_group_weights(layer, modules, layout) for modules in layout.groups] for layer in self.weights]
        return self.groups


def _group_weights(layer: dict, modules: tuple[str, ...], layout: LoraLayout) -> tuple[torch.Tensor, torch.Tensor] | None:
    parts = [(i, layer[m]) for i, m in enumerate(modules) if m in layer]
    if not parts:
        return None
    if len(modules) == 1:
        return parts[0][1]
    a = torch.cat([ab[0] for _, ab in parts])
    outs = [layout.shapes[m][1] for m in modules]
    offsets = np.concatenate(([0], np.cumsum(outs)))
    b = a.new_zeros(int(offsets[-1]), a.shape[0])
    col = 0
    for i, (_, lb) in parts:
        b[int(offsets[i]) : int(offsets[i + 1]), col : col + lb.shape[1]] = lb
        col += lb.shape[1]
    return a, b


def _read_config(directory: Path) -> dict:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise LoraLoadError(f"{CONFIG_FILE} not found")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise LoraLoadError(f"{CONFIG_FILE} is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise LoraLoadError(f"{CONFIG_FILE} is not a JSON object")
    return config


def _check_config(config: dict, max_rank: int) -> None:
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise LoraLoadError(f"peft_type {peft_type!r} is not LORA")
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise LoraLoadError(f"{what} is not supported")
    bias = config.get("bias", "none")
    if bias != "none":
        raise LoraLoadError(f"bias {bias!r} is not supported (only 'none')")
    r = config.get("r")
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise LoraLoadError(f"r must be a positive integer, got {r!r}")
    for key in ("rank_pattern", "alpha_pattern"):
        pattern = config.get(key) or {}
        if not isinstance(pattern, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pattern.values()):
            raise LoraLoadError(f"{key} must map module patterns to numbers")
    ranks = [r] + list((config.get("rank_pattern") or {}).values())
    if any(not isinstance(x, int) or x < 1 for x in ranks):
        raise LoraLoadError("rank_pattern ranks must be positive integers")
    if max(ranks) > max_rank:
        raise LoraLoadError(f"rank {max(ranks)} exceeds --max-lora-rank {max_rank}")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise LoraLoadError(f"lora_alpha must be a number, got {alpha!r}")
    target = config.get("target_modules")
    if target is None:
        raise LoraLoadError("target_modules is not given")
    if not isinstance(target, (str, list)) or (isinstance(target, list) and not all(isinstance(t, str) for t in target)):
        raise LoraLoadError(f"target_modules must be a list of names or a regex string, got {target!r}")


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    path = directory / SAFETENSORS_FILE
    try:
        if path.is_file():
            from safetensors.torch import load_file

            return load_file(str(path))
        path = directory / BIN_FILE
        if path.is_file():
            weights = torch.load(path, map_location="cpu", weights_only=True)
            if not isinstance(weights, dict):
                raise LoraLoadError(f"{BIN_FILE} holds a {type(weights).__name__}, not a state dict")
            return weights
    except LoraLoadError:
        raise
    except Exception as error:  # a truncated or foreign file: whatever the reader raises
        raise LoraLoadError(f"{path.name} cannot be read: {type(error).__name__}: {error}") from None
    raise LoraLoadError(f"{SAFETENSORS_FILE} not found (nor {BIN_FILE})")


def _module_key(prefix: str, layer: int, module: str) -> str:
    """The module's name in the HF model, as PEFT matches it."""
    return f"{prefix}layers.{layer}.{_PARENT[module]}.{module}"


def _listed(key: str, names: list[str]) -> bool:
    """PEFT's list matching: the whole name, or a dotted suffix of it."""
    return key in names or any(key.endswith(f".{name}") for name in names)


def _layer_allowed(key: str, config: dict) -> bool:
    """layers_to_transform / layers_pattern, as PEFT applies them to a list of target modules."""
    indexes = config.get("layers_to_transform")
    if indexes is None or (isinstance(indexes, list) and not indexes):
        return True
    patterns = config.get("layers_pattern")
    match = None
    if not patterns:
        match = re.match(r".*?\.[^.]*\.(?P<idx>\d+)\.", key)
    else:
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            match = re.match(rf"(?:^|.*?\.){pattern}\.(?P<idx>\d+)\.", key)
            if match is not None:
                break
    if match is None:
        return False
    index = int(match.group("idx"))
    return index == indexes if isinstance(indexes, int) else index in indexes


def _excluded(key: str, config: dict) -> bool:
    exclude = config.get("exclude_modules")
    if not exclude:
        return False
    if isinstance(exclude, str):
        return re.fullmatch(exclude, key) is not None
    return _listed(key, exclude)


def _targets(config: dict, layout: LoraLayout, prefix: str) -> set[tuple[int, str]]:
    """The (layer, module) pairs the config targets, checked to name only projections of the model."""
    target = config["target_modules"]
    keys = {(i, m): _module_key(prefix, i, m) for i in range(layout.num_layers) for m in MODULES}
    known = f"{layout.architecture} ({', '.join(MODULES)})"
    if target == "all-linear":  # PEFT: every linear layer but the output head
        chosen = set(keys)
    elif isinstance(target, str):
        try:
            chosen = {k for k, name in keys.items() if re.fullmatch(target, name)}
        except re.error as error:
            raise LoraLoadError(f"target_modules {target!r} is not a valid regex: {error}") from None
        if not chosen:
            raise LoraLoadError(f"target_modules {target!r} matches no module of {known}")
    else:
        for name in target:
            if name.split(".")[-1] in _OTHER_MODULES:
                raise LoraLoadError(f"target module {name} is not supported (LoRA applies to {', '.join(MODULES)})")
            if not any(_listed(key, [name]) for key in keys.values()):
                raise LoraLoadError(f"target module {name} is not a module of {known}")
        chosen = {k for k, key in keys.items() if _listed(key, target) and _layer_allowed(key, config)}
    return {k for k in chosen if not _excluded(keys[k], config)}


def _pattern_value(pattern: dict, key: str, default):
    """PEFT's get_pattern_key: the first pattern that matches a dotted suffix of the module's name."""
    for p in pattern:
        if re.match(rf"(.*\.)?({p})$", key):
            return pattern[p]
    return default


def read_adapter(
    path: str | Path, layout: LoraLayout, max_rank: int, device: torch.device, dtype: torch.dtype,
    lora_id: int = 0, name: str = "", keep_weights: bool = True,
) -> LoraAdapter:
    """The adapter at `path`, its weights on `device` in `dtype` (keep_weights False: checked, not kept).
    Raises LoraLoadError naming the problem."""
    directory = Path(path)
    if not directory.is_dir():
        raise LoraLoadError("not a directory")
    config = _read_config(directory)
    _check_config(config, max_rank)
    stored = _read_weights(directory)
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    prefixes = set()
    for key, tensor in stored.items():
        match = _WEIGHT_KEY.fullmatch(key)
        if match is None or match["module"] not in MODULES or _PARENT[match["module"]] != match["parent"]:
            raise LoraLoadError(f"unexpected weight {key} (only lora_A / lora_B of {', '.join(MODULES)})")
        prefixes.add(match["prefix"])
        found.setdefault((int(match["layer"]), match["module"]), {})[match["ab"]] = tensor
    if not found:
        raise LoraLoadError(f"{SAFETENSORS_FILE} holds no LoRA weights")
    if len(prefixes) > 1:
        raise LoraLoadError("weights are named for two different base models (with and without 'model.')")
    prefix = prefixes.pop()
    layers = max(layer for layer, _ in found) + 1
    if layers > layout.num_layers or (config.get("layers_to_transform") in (None, []) and layers != layout.num_layers):
        raise LoraLoadError(f"the adapter has weights for {layers} layers, {layout.architecture} has {layout.num_layers}")
    targets = _targets(config, layout, prefix)
    stray = sorted(set(found) - targets)
    if stray:
        layer, module = stray[0]
        raise LoraLoadError(f"weights for {_module_key(prefix, layer, module)}, which target_modules does not name")
    rank_pattern, alpha_pattern = config.get("rank_pattern") or {}, config.get("alpha_pattern") or {}
    weights: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in range(layout.num_layers)]
    present = np.zeros((layout.num_layers, len(layout.groups)), bool)
    group_of = {m: g for g, modules in enumerate(layout.groups) for m in modules}
    top = 0
    for layer, module in sorted(targets):
        key = _module_key(prefix, layer, module)
        pair = found.get((layer, module), {})
        for ab in "AB":
            if ab not in pair:
                raise LoraLoadError(f"missing weight base_model.model.{key}.lora_{ab}.weight")
        r = _pattern_value(rank_pattern, key, config["r"])
        alpha = _pattern_value(alpha_pattern, key, config.get("lora_alpha", 8))
        fan_in, fan_out = layout.shapes[module]
        # fan_in_fan_out is for GPT-2's Conv1D; PEFT turns it off for nn.Linear, as these are.
        for ab, want in (("A", (r, fan_in)), ("B", (fan_out, r))):
            if tuple(pair[ab].shape) != want:
                raise LoraLoadError(
                    f"weight base_model.model.{key}.lora_{ab}.weight has shape {list(pair[ab].shape)}, expected {list(want)}"
                )
        if not pair["A"].is_floating_point() or not pair["B"].is_floating_point():
            raise LoraLoadError(f"weights of {key} are not floating point")
        scaling = alpha / (r**0.5 if config.get("use_rslora") else r)
        top = max(top, r)
        present[layer, group_of[module]] = True
        if keep_weights:
            a = pair["A"].to(device=device, dtype=dtype).contiguous()
            b = (pair["B"].to(torch.float32) * scaling).to(device=device, dtype=dtype).contiguous()
            weights[layer][module] = (a, b)
    return LoraAdapter(lora_id, name, str(path), top, weights, present)
