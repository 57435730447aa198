"""One decoder covering Llama (2, 3), Mistral, Qwen2 and Qwen3.

The families differ only in small switches read from config.json: q/k/v bias
(Qwen2), per-head q/k RMSNorm (Qwen3), sliding windows (Mistral), rope scaling
(Llama 3) and tied embeddings. Weights are plain tensors keyed by their HF
names, except that q/k/v and gate/up are fused at load time (one matrix
multiply each). The forward pass works on a flattened batch of new tokens;
the attention backend writes their K/V into the paged cache and attends
through block tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..attention import StepAttention
from ..parallel.tensor_parallel import Partition, TensorParallelGroup
from ..sampling.head_screen import HeadScreen, native_screen_kind
from .config import ModelConfig, MoeConfig
from .layer_ops import TorchOps, TritonOps
from .rope import Rotary
from .weights import WeightReader

if TYPE_CHECKING:
    from ..lora import LoraBatch


# torch's grouped matrix multiply (torch >= 2.10: F.grouped_mm; earlier: torch._grouped_mm), or None.
_GROUPED_MM = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)

@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    # q/k/v as one fused weight (rows q, then k, then v), or three when unfused.
    qkv: list[torch.Tensor]
    qkv_bias: list[torch.Tensor | None]
    o_proj: torch.Tensor
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor
    # gate/up fused (rows gate, then up), or two when unfused; empty in a mixture-of-experts layer.
    gate_up: list[torch.Tensor]
    gate_up_bias: list[torch.Tensor | None]
    down_proj: torch.Tensor | None
    down_bias: torch.Tensor | None
    # A mixture-of-experts layer's router and experts (None: the dense MLP above).
    moe: MoeWeights | None = None


@dataclass
class MoeWeights:
    """A mixture-of-experts MLP: the router [experts, hidden], every expert's gate and up rows fused
    [experts, 2 * intermediate, hidden] (as transformers holds them) and its down [experts, hidden, intermediate]."""

    router: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    config: MoeConfig
    # Qwen2-MoE's shared expert (gate and up rows fused, down) and its gate [1, hidden]; None: none.
    shared_gate_up: torch.Tensor | None = None
    shared_down: torch.Tensor | None = None
    shared_gate: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.router, self.gate_up, self.down, self.shared_gate_up, self.shared_down, self.shared_gate) if t is not None]


def _fused(parts: list[torch.Tensor | None], fuse: bool) -> list[torch.Tensor | None]:
    if not fuse:
        return parts
    if parts[0] is None:
        return [None]
    # One matrix multiply instead of several; the originals are freed after.
    return [torch.cat(parts, dim=0)]


def _load_layer(reader: WeightReader, config: ModelConfig, i: int, fuse: bool, part: Partition | None = None) -> LayerWeights:
    """part: this rank's share under tensor parallelism (None: the whole layer)."""
    p = f"model.layers.{i}."
    attn, mlp = p + "self_attn.", p + "mlp."
    d = config.head_dim
    # Column-parallel (q/k/v, gate/up: output rows) and row-parallel (o, down: input columns) slices.
    qkv_rows = (lambda n, t: t) if part is None else (lambda n, t: part.qkv_rows(n, t, d))
    inter_rows = (lambda t: t) if part is None else part.intermediate_rows
    o_columns = (lambda t: t) if part is None else (lambda t: part.o_columns(t, d))
    down_columns = (lambda t: t) if part is None else part.down_columns

    def opt(name: str, wanted: bool) -> torch.Tensor | None:
        return reader.get(p + name) if wanted else None

    moe = config.moe
    sparse = moe is not None and moe.sparse_layers[i]
    if sparse and part is not None:
        raise ValueError("mixture-of-experts layers do not run tensor parallel")

    def experts(name: str) -> list[torch.Tensor]:
        return [reader.get(f"{mlp}experts.{e}.{name}_proj.weight") for e in range(moe.num_experts)]

    return LayerWeights(
        input_norm=reader.get(p + "input_layernorm.weight"),
        qkv=_fused([qkv_rows(n, reader.get(attn + f"{n}_proj.weight")) for n in "qkv"], fuse),
        qkv_bias=_fused(
            [qkv_rows(n, reader.get(attn + f"{n}_proj.bias")) if config.qkv_bias else None for n in "qkv"], fuse
        ),
        o_proj=o_columns(reader.get(attn + "o_proj.weight")),
        o_bias=opt("self_attn.o_proj.bias", config.o_bias),
        q_norm=opt("self_attn.q_norm.weight", config.qk_norm),
        k_norm=opt("self_attn.k_norm.weight", config.qk_norm),
        post_norm=reader.get(p + "post_attention_layernorm.weight"),
        gate_up=[] if sparse else _fused([inter_rows(reader.get(mlp + f"{n}_proj.weight")) for n in ("gate", "up")], fuse),
        gate_up_bias=[] if sparse else _fused(
            [inter_rows(reader.get(mlp + f"{n}_proj.bias")) if config.mlp_bias else None for n in ("gate", "up")], fuse
        ),
        down_proj=None if sparse else down_columns(reader.get(mlp + "down_proj.weight")),
        down_bias=None if sparse else opt("mlp.down_proj.bias", config.mlp_bias),
        moe=MoeWeights(
            router=reader.get(mlp + "gate.weight"),
            gate_up=torch.stack([torch.cat(pair) for pair in zip(experts("gate"), experts("up"))]),
            down=torch.stack(experts("down")),
            config=moe,
            shared_gate_up=torch.cat([reader.get(f"{mlp}shared_expert.{n}_proj.weight") for n in ("gate", "up")]) if moe.shared_intermediate_size else None,
            shared_down=reader.get(mlp + "shared_expert.down_proj.weight") if moe.shared_intermediate_size else None,
            shared_gate=reader.get(mlp + "shared_expert_gate.weight") if moe.shared_intermediate_size else None,
        ) if sparse else None,
    )


def _project(h: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor | None], sizes: list[int],
             lora: LoraBatch | None = None, i: int = 0, groups: tuple[int, ...] = ()):
    """lora: the step's adapters, added to the output of each of `groups` (the LoRA groups of the weights) at layer i."""
    if len(weights) == 1:
        y = F.linear(h, weights[0], biases[0])
        if lora is not None:
            lora.add_(y, h, i, groups[0])
        return y.split(sizes, dim=-1)
    outs = [F.linear(h, w, b) for w, b in zip(weights, biases)]
    if lora is not None:
        for y, group in zip(outs, groups):
            lora.add_(y, h, i, group)
    return outs


@dataclass(frozen=True)
class LoraGroups:
    """Which LoRA group (lora/adapter.py FUSED_GROUPS or UNFUSED_GROUPS) each projection's output is."""

    qkv: tuple[int, ...]
    o: int
    gate_up: tuple[int, ...]
    down: int


FUSED_LORA_GROUPS = LoraGroups((0,), 1, (2,), 3)
UNFUSED_LORA_GROUPS = LoraGroups((0, 1, 2), 3, (4, 5), 6)


# Rows the packed lm_head layout is chosen for (oneDNN picks its blocking from it;
# measured the same from 8 to 256 on the 19.7M Llama's head; 1 is slower).
_PACKED_ROWS_HINT = 32


class LMHead:
    """The vocabulary projection: hidden rows [rows, hidden] -> float32 logits
    [rows, vocab], in the layout that is fastest for the row count.

    On CPU the projection is most of a small model's step (the 19.7M Llama
    of bench/make_llama_19m.py: [rows, 128] x [128, 151936]), and F.linear
    (MKL on the [vocab, hidden] weight) is far from the core's FLOP rate.
    Measured on a 2-core AVX-512 EPYC, float32, one thread (CPU ms):

        rows   F.linear   oneDNN packed   x @ weight.T (contiguous)
           1     12.0          6.0            4.0
          32     29.8         15.7           26.9
         256    201.3        172.2          117.9  (2 threads: 202 vs 259)

    so one row (a GEMV, bound by reading the weight) multiplies the
    transposed copy, and every other count runs on oneDNN's prepacked
    weight (about 80 GFLOP/s per core at 32 rows, the core's peak; a row's
    values do not depend on how many rows share the call). bfloat16 uses the
    packed weight for every count (MKL has no bfloat16 GEMM). Elsewhere
    (CUDA, no oneDNN) it is F.linear.

    A float32 head on a CPU that multiplies int8 (VNNI) or bfloat16 natively
    also gets a screen (head_screen.py): a low-precision copy that decides
    plain rows' tokens with an exact float32 rescoring of the few near the top.

    Memory: each extra layout is one more copy of the head (the screen's is a
    quarter of one in int8, half in bfloat16). A tied head keeps the embedding
    too; an untied one keeps no [vocab, hidden] copy once packed, unless the
    screen rescores from it.
    """

    def __init__(self, weight: torch.Tensor, screen: bool = True):
        self.packed = _packed_for_cpu(weight)
        self.transposed = weight.t().contiguous() if self.packed is not None and weight.dtype == torch.float32 else None
        kind = native_screen_kind() if screen and self.transposed is not None else None
        self.screen = HeadScreen(weight, kind, _PACKED_ROWS_HINT) if kind is not None else None
        self.weight = weight if self.packed is None or self.screen is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight).to(torch.float32)
        if x.shape[0] == 1 and self.transposed is not None:
            return torch.mm(x, self.transposed)
        return _packed_linear(x, self.packed).to(torch.float32)

    def tensors(self) -> list[torch.Tensor]:
        screen = self.screen.projection.packed if self.screen is not None else None
        return [t for t in (self.weight, self.packed, self.transposed, screen) if t is not None]


def _packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def _packed_for_cpu(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight in oneDNN's blocked layout, or None where that is not available
    (not CPU, no oneDNN, another dtype, or a probe whose result differs)."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACKED_ROWS_HINT)
        probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
        expected = F.linear(probe, weight).float()
        got = _packed_linear(probe, packed).float()
    except (RuntimeError, AttributeError):  # a torch without these private ops
        return None
    tolerance = 1e-4 if weight.dtype == torch.float32 else 2e-2
    scale = expected.abs().max().item() or 1.0
    if not (got - expected).abs().max().item() <= tolerance * scale:
        return None
    return packed


class DecoderModel:
    """tp: this process's tensor-parallel rank group (None: one process holds
    the whole model). With a group, self.config is the rank's local view (its
    own head and intermediate counts) and full_config the model's."""

    def __init__(
        self, config: ModelConfig, reader: WeightReader, fuse: bool = True, tp: TensorParallelGroup | None = None, head: bool = True
    ):
        """head False: no vocabulary projection (a pooling model reads the hidden states only)."""
        self.tp = tp
        self.full_config = config
        self.partition = Partition.of(config, tp.rank, tp.size) if tp is not None else None
        part = self.partition
        self.config = part.local_config(config) if part is not None else config
        self.dtype = reader.dtype
        self.device = reader.device
        vocab_rows = (lambda t: t) if part is None else part.vocab_rows
        self.embed = vocab_rows(reader.get("model.embed_tokens.weight"))
        self.layers = [_load_layer(reader, config, i, fuse, part) for i in range(config.num_layers)]
        self.lora_groups = FUSED_LORA_GROUPS if fuse else UNFUSED_LORA_GROUPS
        c = self.config
        self.qkv_sizes = [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim]
        self.gate_up_sizes = [c.intermediate_size, c.intermediate_size]
        self.norm = reader.get("model.norm.weight")
        # Tied models usually omit lm_head.weight; share the embedding then.
        tied = config.tie_word_embeddings or not reader.has("lm_head.weight")
        self.lm_head = LMHead(self.embed if tied else vocab_rows(reader.get("lm_head.weight")), screen=tp is None) if head else None
        self.rotary = Rotary(config.rope, config.head_dim, self.device)
        # Norms, rotation and SiLU * up: one Triton launch each on CUDA, plain torch elsewhere.
        self.ops = TritonOps(config.rms_norm_eps) if self.device.type == "cuda" else TorchOps(config.rms_norm_eps)
        self.scale = config.head_dim**-0.5

    def weight_bytes(self) -> int:
        head = self.lm_head.tensors() if self.lm_head is not None else []
        tensors = [self.embed, self.norm] + [t for t in head if t is not self.embed]
        for layer in self.layers:
            for value in vars(layer).values():
                if isinstance(value, MoeWeights):
                    tensors += value.tensors()
                elif isinstance(value, (list, torch.Tensor)):
                    tensors += [t for t in (value if isinstance(value, list) else [value]) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        logits_indices: torch.Tensor,
        attention: StepAttention,
        replace: tuple[torch.Tensor, torch.Tensor] | None = None,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor | None:
        """Runs all new tokens of a step (attention: what the backend's prepare()
        returned for it); returns float32 logits [len(logits_indices), vocab] (None on a
        tensor-parallel rank other than 0)."""
        return self.logits(self.hidden_states(input_ids, positions, attention, replace, lora), logits_indices)

    @torch.inference_mode()
    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: StepAttention,
        replace: tuple[torch.Tensor, torch.Tensor] | None = None,
        lora: LoraBatch | None = None,
        deepstack: tuple[torch.Tensor, list[torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """The residual stream after the last layer, one row per new token (before the final norm).
        replace: (indices, rows): these rows stand in for the token embeddings at those indices
        (image features at image-token positions). lora: the step's LoRA adapters, added to the
        projections of their tokens (None: no token has one). deepstack: (indices, [rows per layer])
        (Qwen3-Omni's vision features): after layer i, rows[i] are added to the residual stream at
        those indices, as transformers' _deepstack_process adds them."""
        x = F.embedding(input_ids, self.embed) if self.tp is None else self.tp.embed(input_ids, self.embed, self.partition)
        if replace is not None:
            x = x.index_copy(0, replace[0], replace[1].to(x.dtype))
        cos, sin = self.rotary.cos_sin(positions, self.dtype)
        ops = self.ops
        delta = None  # the previous layer's MLP output, added with the next norm
        for i, layer in enumerate(self.layers):
            if delta is None:
                h = ops.rms_norm(x, layer.input_norm)
            else:
                x, h = ops.add_rms_norm(x, delta, layer.input_norm)
            x, h = ops.add_rms_norm(x, self._attention(i, layer, h, cos, sin, attention, lora), layer.post_norm)
            delta = self._mlp(i, layer, h, lora)
            if deepstack is not None and i < len(deepstack[1]):
                # The layer's output, then the features: one addition each, as transformers makes them.
                x, delta = x + delta, None
                x.index_add_(0, deepstack[0], deepstack[1][i].to(x.dtype))
        return x if delta is None else x + delta

    def head_input(self, hidden: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The rows at `indices` through the final norm: what the vocabulary projection multiplies."""
        return self.ops.rms_norm(hidden.index_select(0, indices), self.norm)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, indices: torch.Tensor) -> torch.Tensor | None:
        """float32 logits of the hidden_states rows at `indices`. Tensor parallel:
        every rank must call it (the vocabulary slices are gathered); rank 0 gets
        the logits, the others None."""
        logits = self.lm_head(self.head_input(hidden, indices))
        if self.tp is None:
            return logits
        return self.tp.gather_logits(logits, self.full_config.vocab_size)

    def _attention(self, i, layer: LayerWeights, h, cos, sin, attention: StepAttention, lora: LoraBatch | None = None) -> torch.Tensor:
        c = self.config
        t = h.shape[0]
        q, k, v = _project(h, layer.qkv, layer.qkv_bias, self.qkv_sizes, lora, i, self.lora_groups.qkv)
        q = q.view(t, c.num_heads, c.head_dim)
        k = k.view(t, c.num_kv_heads, c.head_dim)
        v = v.view(t, c.num_kv_heads, c.head_dim)
        if layer.q_norm is not None:
            q = self.ops.rms_norm(q, layer.q_norm)
            k = self.ops.rms_norm(k, layer.k_norm)
        q = self.ops.rotary(q, cos, sin)
        k = self.ops.rotary(k, cos, sin)
        out = attention.run(i, q, k, v).reshape(t, c.num_heads * c.head_dim)
        if self.tp is None:
            y = F.linear(out, layer.o_proj, layer.o_bias)
            if lora is not None:  # (LoRA never runs tensor parallel: loading refuses it)
                lora.add_(y, out, i, self.lora_groups.o)
            return y
        return self._row_parallel(out, layer.o_proj, layer.o_bias)

    def _mlp(self, i: int, layer: LayerWeights, h: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        if layer.moe is not None:
            return self._experts(layer.moe, h)
        if len(layer.gate_up) == 1:
            gate_up = F.linear(h, layer.gate_up[0], layer.gate_up_bias[0])
            if lora is not None:
                lora.add_(gate_up, h, i, self.lora_groups.gate_up[0])
            act = self.ops.silu_mul(gate_up)
        else:
            gate, up = _project(h, layer.gate_up, layer.gate_up_bias, self.gate_up_sizes, lora, i, self.lora_groups.gate_up)
            act = F.silu(gate) * up
        if self.tp is None:
            y = F.linear(act, layer.down_proj, layer.down_bias)
            if lora is not None:
                lora.add_(y, act, i, self.lora_groups.down)
            return y
        return self._row_parallel(act, layer.down_proj, layer.down_bias)

    def _experts(self, moe: MoeWeights, h: torch.Tensor) -> torch.Tensor:
        """The mixture of experts over the step's tokens h [T, hidden], grouped per expert: the tokens routed
        to an expert go through it in one pair of matrix multiplies. transformers' arithmetic (Qwen3MoeExperts):
        the router's softmax in float32, top-k, renormalized when the config says so, cast back; each
        expert's output scaled by its weight and added into the token's sum in ascending expert order."""
        c = moe.config
        logits = F.linear(h, moe.router)
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, c.top_k, dim=-1)
        if c.norm_topk_prob:
            weights /= weights.sum(dim=-1, keepdim=True)
        weights = weights.to(logits.dtype).reshape(-1)
        flat = chosen.reshape(-1)
        # Every (token, choice) pair sorted by its expert.
        order = torch.argsort(flat, stable=True)
        if h.is_cuda and h.dtype == torch.bfloat16 and _GROUPED_MM is not None:
            out = self._experts_grouped(moe, h, flat, order, weights)
        else:
            out = self._experts_looped(moe, h, flat, order, weights)
        if moe.shared_gate_up is not None:
            # Qwen2MoeSparseMoeBlock: the shared expert scaled by its sigmoid gate, added after the experts.
            shared = F.linear(self.ops.silu_mul(F.linear(h, moe.shared_gate_up)), moe.shared_down)
            out = out + torch.sigmoid(F.linear(h, moe.shared_gate)) * shared
        return out

    def _experts_looped(self, moe: MoeWeights, h: torch.Tensor, flat: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """One pair of matrix multiplies per expert that has tokens, each expert's output added into its tokens'
        sums in ascending expert order: transformers' arithmetic to the bit (float32), at one host read of the
        counts per layer."""
        c = moe.config
        counts = torch.bincount(flat, minlength=c.num_experts).tolist()
        out = torch.zeros_like(h)
        start = 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            pairs = order[start : start + n]
            start += n
            tokens = pairs // c.top_k
            y = F.linear(self.ops.silu_mul(F.linear(h.index_select(0, tokens), moe.gate_up[expert])), moe.down[expert])
            out.index_add_(0, tokens, y * weights.index_select(0, pairs)[:, None])
        return out

    def _experts_grouped(self, moe: MoeWeights, h: torch.Tensor, flat: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """bfloat16 on a GPU: every expert's tokens in one grouped matrix multiply per projection, the group
        boundaries computed on the device (the looped path's host read per layer stalls the GPU, and its
        launches grow with the experts), then each token's top-k outputs weighted and summed in a fixed order
        (no atomic adds: the same input gives the same bits)."""
        c = moe.config
        # scatter_add, not bincount: CUDA's bincount reads its input's maximum on the host.
        counts = torch.zeros(c.num_experts, dtype=torch.int32, device=h.device).scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        x = h.index_select(0, order // c.top_k)
        y = _GROUPED_MM(self.ops.silu_mul(_GROUPED_MM(x, moe.gate_up.transpose(1, 2), offs=offsets)), moe.down.transpose(1, 2), offs=offsets)
        pairs = torch.empty_like(y).index_copy_(0, order, y)  # back to (token, choice) order
        return (pairs.view(h.shape[0], c.top_k, -1) * weights.view(h.shape[0], c.top_k, 1)).sum(dim=1)

    def _row_parallel(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """A row-parallel projection: this rank's partial sum, all-reduced, then the (whole) bias once."""
        out = self.tp.all_reduce(F.linear(x, weight))
        return out if bias is None else out + bias
