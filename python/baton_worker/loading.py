"""Start-up: from worker options to a loaded model, a KV cache and the Ready message.

Sizing rules:
- num_blocks: --num-blocks, else --kv-cache-memory-bytes / bytes per block;
  that budget defaults to 1 GiB on CPU and 90% of free GPU memory (measured
  after the weights are loaded) on CUDA.
- max_model_len: --max-model-len, else config max_position_embeddings. When the
  cache cannot hold one sequence of that length it is capped to
  num_blocks * block_size if the user did not ask for a length, and is a
  startup error if they did.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .attention import FlexBackend, make_backend
from .config import ConfigError, ModelConfig, load_model_config
from .graph.export import export_graph
from .graph.llm import LLMGraphModel
from .kv_cache import KVCache, bytes_per_block
from .loader import WeightReader, stderr_progress
from .model import DecoderModel
from .options import WorkerOptions
from .protocol import PROTOCOL_VERSION, Ready
from .sampler import Sampler
from .step_runner import StepRunner

CPU_KV_BYTES = 1 << 30
GPU_KV_FRACTION = 0.9
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedWorker:
    runner: StepRunner
    ready: Ready
    config: ModelConfig


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was requested but CUDA is not available")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device("cuda", torch.cuda.current_device()) if name == "cuda" else torch.device("cpu")


def resolve_dtype(name: str, config: ModelConfig, device: torch.device | None = None) -> torch.dtype:
    if name == "auto":
        # The checkpoint's own dtype; float32 when it does not say. On CUDA
        # bfloat16 unless the checkpoint is 16-bit already (float32 halves
        # the speed of a memory-bound decode for no serving benefit).
        name = config.torch_dtype if config.torch_dtype in _DTYPES else "float32"
        if device is not None and device.type == "cuda" and name == "float32":
            name = "bfloat16"
    return _DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _num_blocks(opts: WorkerOptions, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> int:
    if opts.num_blocks is not None:
        return opts.num_blocks
    budget = opts.kv_cache_memory_bytes
    if budget is None:
        if device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            budget = int(free * GPU_KV_FRACTION)
        else:
            budget = CPU_KV_BYTES
    blocks = budget // bytes_per_block(config, opts.block_size, dtype)
    if blocks < 1:
        raise ConfigError(f"a KV cache budget of {budget} bytes holds no block of {opts.block_size} tokens")
    return int(blocks)


def _max_model_len(opts: WorkerOptions, config: ModelConfig, num_blocks: int) -> int:
    capacity = num_blocks * opts.block_size
    if opts.max_model_len is not None:
        if opts.max_model_len > config.max_position_embeddings:
            raise ConfigError(
                f"--max-model-len {opts.max_model_len} exceeds the model's max_position_embeddings "
                f"{config.max_position_embeddings}"
            )
        if opts.max_model_len > capacity:
            raise ConfigError(
                f"--max-model-len {opts.max_model_len} needs {-(-opts.max_model_len // opts.block_size)} KV blocks "
                f"but the cache has {num_blocks} ({capacity} tokens); raise --num-blocks/--kv-cache-memory-bytes "
                f"or lower --max-model-len"
            )
        return opts.max_model_len
    return min(config.max_position_embeddings, capacity)


def _capture_graphs(model: DecoderModel, attention: FlexBackend, max_pages: int):
    from .cuda_graphs import DecodeGraphs

    try:
        return DecodeGraphs(model, attention, max_pages)
    except Exception as error:  # untested on real GPUs so far: eager steps still work
        print(f"baton_worker: CUDA graph capture failed, decode steps run eagerly: {error}", file=sys.stderr, flush=True)
        return None


def load_worker(opts: WorkerOptions, attention_backend: str = "auto", fuse_weights: bool = True) -> LoadedWorker:
    """attention_backend: auto (cpu on CPU, flex on CUDA), reference, cpu or flex;
    fuse_weights=False keeps q/k/v and gate/up apart (the pre-fusion path, for benchmarks)."""
    dummy = opts.load_format == "dummy-null"
    model_dir = Path(opts.model)
    config = load_model_config(model_dir, lenient=dummy)
    device = resolve_device(opts.device)
    dtype = resolve_dtype(opts.dtype, config, device)
    torch.manual_seed(opts.seed)
    model, cache, attention = None, None, None
    if not dummy:
        reader = WeightReader(model_dir, dtype, device, stderr_progress() if opts.progress else None)
        model = DecoderModel(config, reader, fuse=fuse_weights)
        reader.close()
    num_blocks = _num_blocks(opts, config, dtype, device)
    max_model_len = _max_model_len(opts, config, num_blocks)
    if not dummy:
        cache = KVCache(config, num_blocks, opts.block_size, dtype, device)
        attention = make_backend(attention_backend, cache, config.num_heads, model.scale, config.sliding_windows)
    runner = StepRunner(model, attention, Sampler(opts.seed, device), config.vocab_size, opts.block_size, num_blocks, device)
    if isinstance(attention, FlexBackend) and device.type == "cuda":
        runner.graphs = _capture_graphs(model, attention, -(-max_model_len // opts.block_size))
    ready = Ready(
        protocol_version=PROTOCOL_VERSION,
        num_blocks=num_blocks,
        block_size=opts.block_size,
        max_model_len=max_model_len,
        vocab_size=config.vocab_size,
        architecture=config.architecture,
        dtype=dtype_name(dtype),
        device=str(device),
        worker_pid=os.getpid(),
        graph=export_graph(LLMGraphModel(max_model_len)),
    )
    return LoadedWorker(runner, ready, config)
