"""The worker's command line.

python -m baton_worker --model DIR --in-endpoint EP --out-endpoint EP
    --block-size N [--num-blocks N] [--kv-cache-memory-bytes B]
    [--max-model-len L] [--dtype auto|float32|bfloat16|float16]
    [--device auto|cpu|cuda] [--seed S] [--load-format auto|dummy|dummy-null]
    [--progress] [--nodes NAME[,NAME...]] [--rank N] [--shm-bytes B]
    [--tensor-parallel-size N] [--distributed-executor-backend mp|ray]
    [--host-workers N] [--runner auto|generate|pooling] [--hf-overrides JSON]
    [--model-loader-extra-config JSON]
    [--max-loras N] [--max-lora-rank R]
    [--num-speculative-tokens K] [--prompt-lookup-min N] [--prompt-lookup-max N] [--speculative-model DIR]

--progress prints weight-loading progress to stderr as lines
"BATON_PROGRESS <done> <total>" (tensors), which the supervisor turns into a
progress bar.

--nodes names the graph nodes this worker hosts (default: every node of the
model; loading refuses a name the model does not have). --rank is the
worker's rank in the deployment (default 0): it goes into the `worker` field
of every tensor descriptor this worker produces. --shm-bytes sizes the
shared-memory arena through which tensors go to workers of other ranks
(transfer/shm.py; 0, the default, creates none: a colocated worker needs none).

--tensor-parallel-size N (default 1) makes this process rank 0 of N: it
spawns ranks 1..N-1 with the same command line plus --tp-rank K and
--tp-store HOST:PORT (the TCPStore rank 0 hosts, where the ranks meet);
those two are internal to the rank group (parallel/, server.py).
--distributed-executor-backend picks how those ranks start: mp (default)
as child processes of rank 0, ray as Ray actors in a placement group
(rank_group.py).

--max-loras N (default 0: LoRA off) serves PEFT LoRA adapters, which the
engine loads and unloads through Step.lora; a step's rows use at most N
distinct adapters. --max-lora-rank R (default 16) is the largest adapter
rank it accepts (vLLM's choices are 8, 16, 32, 64, 128, 256, 320, 512; any
positive value works here). Only a plain decoder on one process takes them
(loading.py refuses pooling, tensor parallel and graph models).

--num-speculative-tokens K (default 0: off) turns on speculative decoding
with vLLM's n-gram prompt lookup: after each step the worker proposes up to
K draft tokens per verifiable row, found by matching the row's last n tokens
(n from --prompt-lookup-max down to --prompt-lookup-min, defaults 3 and 1)
earlier in its token list; the engine sends them back in Step.spec and the
worker verifies them greedily. The TypeScript CLI derives these from vLLM's
--speculative-config. With --speculative-model DIR (vLLM's draft_model
method) a smaller decoder with the same vocabulary proposes exactly K drafts
per row instead (spec/draft_model.py). Steps never overlap with K above 0;
like LoRA, only a plain generating decoder on one process takes it (loading.py).

Bad values never make argparse exit with its own status: they raise
OptionsError, which the server reports as a Fatal message and exit code 1.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
LOAD_FORMATS = ("auto", "dummy", "dummy-null")
EXECUTOR_BACKENDS = ("mp", "ray")
ATTENTION_BACKENDS = ("auto", "reference", "cpu", "triton", "flex")
RUNNERS = ("auto", "generate", "pooling")


class OptionsError(Exception):
    pass


@dataclass
class WorkerOptions:
    model: str
    in_endpoint: str
    out_endpoint: str
    block_size: int
    num_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    max_model_len: int | None = None
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    load_format: str = "auto"
    progress: bool = False
    nodes: list[str] | None = None  # None: every node of the model
    rank: int = 0
    # The deployment's model_kwargs: keyword arguments of a graph model's constructor.
    model_kwargs: dict | None = None
    shm_bytes: int = 0  # 0: no shared-memory arena
    tensor_parallel_size: int = 1
    # Worker processes (data-parallel replicas, a deployment's ranks) sharing this host's cores, each with its tensor-parallel ranks.
    host_workers: int = 1
    tp_rank: int = 0  # this process's rank in the tensor-parallel group (0: the one the engine talks to)
    tp_store: str | None = None  # HOST:PORT of rank 0's TCPStore (ranks above 0 only)
    distributed_executor_backend: str = "mp"
    # KV connector: the torch.distributed rendezvous HOST:PORT of the deployment's workers, and their number.
    kv_transfer: str | None = None
    kv_transfer_world: int = 0
    attention_backend: str = "auto"
    max_num_seqs: int = 256  # most rows of a decode step: the largest CUDA graph captured
    enforce_eager: bool = False  # no CUDA graphs: every step runs eagerly
    runner: str = "auto"  # generate | pooling | auto (model/pooling.py resolve_runner)
    # vLLM's --hf-overrides: config.json as restated to serve a decoder as a reranker (model/pooling.py overridden_architecture).
    hf_overrides: dict | None = None
    # vLLM's --model-loader-extra-config: the weight loader's own options (model/weights.py dummy_options).
    model_loader_extra_config: dict | None = None
    max_loras: int = 0  # distinct LoRA adapters a step's rows may use (0: LoRA off)
    max_lora_rank: int = 16  # the largest adapter rank a load accepts
    num_speculative_tokens: int = 0  # n-gram drafts proposed per row (0: speculative decoding off)
    prompt_lookup_min: int = 1  # shortest n-gram the proposer matches
    prompt_lookup_max: int = 3  # longest n-gram the proposer matches
    speculative_model: str | None = None  # the draft model's directory (None: n-gram proposals)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit 2
        raise OptionsError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m baton_worker", description="Baton model worker")
    p.add_argument("--model", required=True)
    p.add_argument("--in-endpoint", required=True, help="engine's PUSH socket (the worker connects a PULL)")
    p.add_argument("--out-endpoint", required=True, help="engine's PULL socket (the worker connects a PUSH)")
    p.add_argument("--block-size", type=int, required=True)
    p.add_argument("--num-blocks", type=int)
    p.add_argument("--kv-cache-memory-bytes", type=int)
    p.add_argument("--max-model-len", type=int)
    # Checked after parsing so the error message can list the choices itself.
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--nodes", help="comma-separated graph nodes this worker hosts (default: all)")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--model-kwargs", help="JSON object: keyword arguments of the graph model's constructor")
    p.add_argument("--shm-bytes", type=int, default=0)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--host-workers", type=int, default=1, help="worker processes sharing this host's cores (torch threads: cores / (this x TP size))")
    p.add_argument("--tp-rank", type=int, default=0)
    p.add_argument("--tp-store")
    p.add_argument("--distributed-executor-backend", default="mp")
    p.add_argument("--kv-transfer", help="HOST:PORT: KV transfer rendezvous (prefill/decode disaggregation)")
    p.add_argument("--kv-transfer-world", type=int, default=0, help="workers in the KV transfer group")
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--runner", default="auto", help="generate, pooling (embedding models) or auto (vLLM's --runner)")
    p.add_argument("--hf-overrides", help="JSON object: config.json keys restated (vLLM's; a decoder served as Qwen3-Reranker)")
    p.add_argument("--model-loader-extra-config", help="JSON object: the weight loader's options (--load-format dummy: residual_scale)")
    p.add_argument("--max-loras", type=int, default=0, help="distinct LoRA adapters per step (0: LoRA off)")
    p.add_argument("--max-lora-rank", type=int, default=16, help="the largest LoRA rank an adapter may have")
    p.add_argument("--num-speculative-tokens", type=int, default=0, help="n-gram draft tokens per row (0: speculative decoding off)")
    p.add_argument("--prompt-lookup-min", type=int, default=1, help="shortest n-gram matched for drafts")
    p.add_argument("--prompt-lookup-max", type=int, default=3, help="longest n-gram matched for drafts")
    p.add_argument("--speculative-model", help="draft model directory: it proposes the drafts instead of n-gram lookup")
    return p


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionsError(f"unsupported --{name} {value!r}; supported: {', '.join(choices)}")


def parse_options(argv: list[str]) -> WorkerOptions:
    args = _parser().parse_args(argv)
    _choice("dtype", args.dtype, DTYPES)
    _choice("device", args.device, DEVICES)
    _choice("load-format", args.load_format, LOAD_FORMATS)
    _choice("distributed-executor-backend", args.distributed_executor_backend, EXECUTOR_BACKENDS)
    _choice("attention-backend", args.attention_backend, ATTENTION_BACKENDS)
    _choice("runner", args.runner, RUNNERS)
    if args.block_size <= 0:
        raise OptionsError(f"--block-size must be positive, got {args.block_size}")
    for name in ("num_blocks", "kv_cache_memory_bytes", "max_model_len", "max_num_seqs"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise OptionsError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if args.max_loras < 0:
        raise OptionsError(f"--max-loras must be >= 0, got {args.max_loras}")
    if args.max_lora_rank < 1:
        raise OptionsError(f"--max-lora-rank must be positive, got {args.max_lora_rank}")
    if args.num_speculative_tokens < 0:
        raise OptionsError(f"--num-speculative-tokens must be >= 0, got {args.num_speculative_tokens}")
    if args.prompt_lookup_min < 1:
        raise OptionsError(f"--prompt-lookup-min must be positive, got {args.prompt_lookup_min}")
    if args.prompt_lookup_max < args.prompt_lookup_min:
        raise OptionsError(f"--prompt-lookup-max {args.prompt_lookup_max} is below --prompt-lookup-min {args.prompt_lookup_min}")
    if args.speculative_model is not None and args.num_speculative_tokens < 1:
        raise OptionsError("--speculative-model needs --num-speculative-tokens of at least 1")
    if args.rank < 0:
        raise OptionsError(f"--rank must be >= 0, got {args.rank}")
    if args.tensor_parallel_size < 1:
        raise OptionsError(f"--tensor-parallel-size must be >= 1, got {args.tensor_parallel_size}")
    if args.host_workers < 1:
        raise OptionsError(f"--host-workers must be >= 1, got {args.host_workers}")
    if not 0 <= args.tp_rank < args.tensor_parallel_size:
        raise OptionsError(f"--tp-rank {args.tp_rank} is outside [0, {args.tensor_parallel_size})")
    if (args.tp_rank > 0) != (args.tp_store is not None):
        raise OptionsError("--tp-store is given to, and only to, tensor-parallel ranks above 0")
    if args.shm_bytes < 0:
        raise OptionsError(f"--shm-bytes must be >= 0, got {args.shm_bytes}")
    if args.kv_transfer is not None and args.kv_transfer_world <= args.rank:
        raise OptionsError(f"--kv-transfer-world must be more than --rank {args.rank}, got {args.kv_transfer_world}")
    if args.nodes is not None:
        args.nodes = _node_list(args.nodes)
    if args.model_kwargs is not None:
        args.model_kwargs = _json_object("--model-kwargs", args.model_kwargs)
    if args.hf_overrides is not None:
        args.hf_overrides = _json_object("--hf-overrides", args.hf_overrides)
    if args.model_loader_extra_config is not None:
        args.model_loader_extra_config = _json_object("--model-loader-extra-config", args.model_loader_extra_config)
    return WorkerOptions(**vars(args))


def _json_object(flag: str, value: str) -> dict:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise OptionsError(f"{flag} is not JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise OptionsError(f"{flag} must be a JSON object, got {type(parsed).__name__}")
    return parsed


def _node_list(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise OptionsError(f"--nodes {value!r} has an empty node name")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise OptionsError(f"--nodes {value!r} names {', '.join(repeated)} more than once")
    return names


def out_endpoint_from(argv: list[str]) -> str | None:
    """Best-effort --out-endpoint, so even a bad command line can be reported as Fatal."""
    for i, arg in enumerate(argv):
        if arg == "--out-endpoint" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--out-endpoint="):
            return arg.split("=", 1)[1]
    return None
