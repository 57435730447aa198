"""Start-up: from worker options to a loaded model, a KV cache and the Ready message.

Sizing rules:
- num_blocks: --num-blocks, else --kv-cache-memory-bytes / bytes per block;
  that budget defaults to 1 GiB on CPU and 90% of free GPU memory (measured
  after the weights are loaded) on CUDA.
- max_model_len: --max-model-len, else config max_position_embeddings. When the
  cache cannot hold one sequence of that length it is capped to
  num_blocks * block_size if the user did not ask for a length, and is a
  startup error if they did.

Graph models: a directory whose config.json architecture is registered in
baton_worker.models loads that GraphModel. The worker hosts the nodes --nodes
names (default: all of them). If one of them is a kv_cache node, its decoder
(GraphModel.get_kv_model_dir) loads exactly as a plain LLM does, with the same
options and sizing rules; the stateless ones run under a NodeRunner. Ready's
graph is the whole model's export, whatever this worker hosts; its
architecture is the directory's (e.g. BatonDemoTTS), its vocab_size,
num_blocks and max_model_len the kv_cache node's decoder's. A worker hosting
no kv_cache node has no KV cache: num_blocks 0 and vocab_size 0, block_size
and max_model_len echo --block-size and --max-model-len (0 when not given),
and dtype is --dtype as resolved without a checkpoint (auto: float32). A plain
LLM directory is the one-node graph LLMGraphModel (node llm).

A kv_cache node whose KvDecoderLayout brings its own decoder (Whisper's:
layout.make_decoder) reads its config and builds its model through the
layout, with real weights only; with cross_attention its StepRunner writes
and reads cross-attention K/V in the same cache (attention/cross.py), with
logits_rules it applies the model's generation rules; either way its steps
never overlap and no CUDA graphs are captured.

Pooling models (--runner pooling, or auto on a sentence-transformers
directory or an encoder architecture; model/pooling.py): a decoder loads as
above without its vocabulary projection and pools instead of sampling; a
bidirectional encoder (model/encoder.py) has no KV cache at all. Its
num_blocks only feeds the engine's block bookkeeping: enough blocks for
--max-num-seqs sequences of max_model_len tokens, so the scheduler never
waits for one. Ready.pooling says how the model pools. A classifier
(a cross-encoder directory, or a decoder that --hf-overrides names
Qwen3ForSequenceClassification) loads the same way with its head
(model/pooling.py ClassifierHead); its rows answer with logits.

LoRA (--max-loras above 0): a plain generating decoder in one process only
(refused with a pooling runner, tensor parallelism and graph models). Its
StepRunner gets a LoraManager, made before the KV cache is sized (on CUDA
its slot stacks take their memory then); adapters themselves load later,
through Step.lora, into what the cache leaves free. Decode steps run
eagerly: no CUDA graphs are captured (a graph would replay without the
step's adapters).

Speculative decoding (--num-speculative-tokens above 0): the same plain
generating decoder in one process only (refused like LoRA). Its StepRunner
gets the n-gram proposer (spec/ngram.py), or with --speculative-model the
draft model (spec/draft_model.py: loaded before the cache is sized, its own
cache of as many blocks as the target's, both out of one budget), and never
overlaps steps; the decode
graphs are captured for up to --max-num-seqs x (K + 1) rows (at most 256),
since a verify step replays them with every token as a row.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..attention import make_backend
from ..attention.cross import CrossAttention
from ..attention.kv_cache import KVCache, bytes_per_block
from ..graph.authoring import EngineType
from ..graph.export import export_graph
from ..graph.llm import LLM_NODE, NODE_ENGINES, LLMGraphModel
from ..graph.model import GraphModel, KvDecoderLayout
from ..graph.node_runner import NodeRunner, TensorStore
from ..graph.worker_runner import GraphStepRunner
from ..kv_connector import KvConnectorWorker, TorchDistributedTransport
from ..lora import LoraLayout, LoraManager
from ..spec.draft_model import DraftModelProposer
from ..spec.ngram import NgramProposer
from ..model.config import ConfigError, ModelConfig, load_model_config, read_json
from ..model.decoder import DecoderModel
from ..model.encoder import EncoderModel, load_encoder_config
from ..model.pooling import (
    DECODER_CLASSIFIERS,
    ENCODER_ARCHITECTURES,
    ChunkPooler,
    ClassifierHead,
    PoolingConfig,
    overridden_architecture,
    pair_separator,
    read_classifier_config,
    read_pooling_config,
    resolve_runner,
    vocabulary_id,
)
from ..model.weights import RandomWeightReader, WeightReader, dummy_options, stderr_progress, weight_files
from ..models import graph_model_class
from ..parallel.tensor_parallel import Partition, TensorParallelGroup, check_tensor_parallel
from ..protocol import PROTOCOL_VERSION, PoolingInfo, Ready
from ..sampling.sampler import Sampler
from ..transfer.shm import ShmArena
from .encoder_runner import EncoderRunner
from .options import WorkerOptions
from .step_runner import StepRunner

CPU_KV_BYTES = 1 << 30
GPU_KV_FRACTION = 0.9
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedWorker:
    runner: StepRunner | None  # the hosted kv_cache node's decoder steps (None: no kv_cache node here)
    ready: Ready
    config: ModelConfig | None  # that decoder's config
    graph_runner: GraphStepRunner  # what the server runs: graph work plus the runner's rows
    nodes: list[str]  # the graph nodes this worker hosts


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was requested but CUDA is not available")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device("cuda", torch.cuda.current_device()) if name == "cuda" else torch.device("cpu")


def resolve_dtype(name: str, config: ModelConfig | None, device: torch.device | None = None) -> torch.dtype:
    """config None: no checkpoint to ask (a worker without a kv_cache node)."""
    if name == "auto":
        # The checkpoint's own dtype; float32 when it does not say. On CUDA
        # bfloat16 unless the checkpoint is 16-bit already (float32 halves
        # the speed of a memory-bound decode for no serving benefit).
        torch_dtype = config.torch_dtype if config is not None else None
        name = torch_dtype if torch_dtype in _DTYPES else "float32"
        if device is not None and device.type == "cuda" and name == "float32":
            name = "bfloat16"
    return _DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _num_blocks(opts: WorkerOptions, config: ModelConfig, dtype: torch.dtype, device: torch.device, draft: ModelConfig | None = None) -> int:
    """draft: a draft model's config, whose cache gets as many blocks as the target's out of the same budget."""
    if opts.num_blocks is not None:
        return opts.num_blocks
    budget = opts.kv_cache_memory_bytes
    if budget is None:
        if device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            budget = int(free * GPU_KV_FRACTION)
        else:
            budget = CPU_KV_BYTES
    per_block = bytes_per_block(config, opts.block_size, dtype) + (bytes_per_block(draft, opts.block_size, dtype) if draft else 0)
    blocks = budget // per_block
    if blocks < 1:
        raise ConfigError(f"a KV cache budget of {budget} bytes holds no block of {opts.block_size} tokens")
    return int(blocks)


def _load_draft(opts: WorkerOptions, target: ModelConfig, dtype: torch.dtype, device: torch.device, fuse_weights: bool) -> DecoderModel:
    """--speculative-model: the draft decoder, in the target's dtype on its device (random weights too with --load-format dummy)."""
    where = f"--speculative-model {opts.speculative_model}"
    if opts.load_format == "dummy-null":
        raise ConfigError(f"{where}: a draft model needs the target's weights (not --load-format dummy-null)")
    draft_dir = Path(opts.speculative_model)
    if not (draft_dir / "config.json").is_file():
        raise ConfigError(f"{where}: no config.json in that directory")
    try:
        config = load_model_config(draft_dir)
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    if config.vocab_size > target.vocab_size:
        raise ConfigError(f"{where}: its vocabulary ({config.vocab_size} tokens) is larger than the target's ({target.vocab_size}); "
                          "a draft model shares the target's tokenizer")
    if opts.load_format == "dummy":
        reader = RandomWeightReader(config, dtype, device, opts.seed, **dummy_options(opts.model_loader_extra_config))
    else:
        reader = WeightReader(draft_dir, dtype, device, None, None)
    model = DecoderModel(config, reader, fuse=fuse_weights)
    reader.close()
    return model


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


def _capture_graphs(model: DecoderModel, attention, max_pages: int, max_rows: int):
    from .cuda_graphs import BATCH_SIZES, DecodeGraphs

    try:
        return DecodeGraphs(model, attention, max_pages, min(max_rows, BATCH_SIZES[-1]))
    except Exception as error:  # a capture that fails leaves a slower worker, not a dead one
        print(f"baton_worker: CUDA graph capture failed, decode steps run eagerly: {error}", file=sys.stderr, flush=True)
        return None


@dataclass
class _Decoder:
    """A kv_cache node's decoder, KV cache and StepRunner, sized by the worker options."""

    runner: StepRunner
    config: ModelConfig
    num_blocks: int
    max_model_len: int
    dtype: torch.dtype
    device: torch.device
    cache: KVCache | None  # None: dummy-null (no forward, no cache), or an encoder
    pooling: PoolingConfig | None = None  # a pooling model's


def _load_decoder(
    opts: WorkerOptions,
    model_dir: Path,
    device: torch.device,
    attention_backend: str,
    fuse_weights: bool,
    tp: TensorParallelGroup | None = None,
    layout: KvDecoderLayout | None = None,
    pooling: bool = False,
    classifier_tokens: list[str] | None = None,
) -> _Decoder:
    """layout: where a composite model keeps its decoder (None: the directory is the decoder's);
    pooling: served as a pooling model (no vocabulary projection; its rows pool instead of sampling);
    classifier_tokens: a reranker's [no, yes]: its one logit is the last row times
    lm_head[yes] - lm_head[no]."""
    dummy = opts.load_format == "dummy-null"
    if pooling and dummy:
        raise ConfigError("a pooling model needs weights (not --load-format dummy-null)")
    custom = layout is not None and layout.make_decoder is not None
    if custom and opts.load_format != "auto":
        raise ConfigError(f"--load-format {opts.load_format} draws Llama-family weights; {model_dir.name}'s decoder loads its own (--load-format auto)")
    if custom:
        config = layout.read_config(model_dir)
    else:
        config = load_model_config(model_dir, lenient=dummy, text_config=layout.text_config if layout else None)
    dtype = resolve_dtype(opts.dtype, config, device)
    if config.moe is not None and (tp is not None or opts.max_loras > 0 or pooling):
        what = "tensor parallelism" if tp is not None else "LoRA adapters" if opts.max_loras > 0 else "a pooling runner"
        raise ConfigError(f"{model_dir.name}: a mixture-of-experts model is served without {what}")
    if tp is not None and dummy:
        raise ConfigError("--tensor-parallel-size above 1 needs real weights (not --load-format dummy-null)")
    model, cache, attention, head = None, None, None, None
    # Under tensor parallelism the KV cache holds this rank's heads only, so the
    # same budget gives every rank the same block count (the engine's block ids
    # address every rank's shard alike).
    local = Partition.of(config, tp.rank, tp.size).local_config(config) if tp is not None else config
    if not dummy:
        rename = layout.rename if layout else None
        progress = stderr_progress() if opts.progress and (tp is None or tp.is_driver) else None
        if opts.load_format == "dummy":
            reader = RandomWeightReader(config, dtype, device, opts.seed, **dummy_options(opts.model_loader_extra_config))
        else:
            stored = weight_files(model_dir) if rename is None else {}
            if "embed_tokens.weight" in stored and "model.embed_tokens.weight" not in stored:
                # A base model's weights (Qwen3Model, as sentence-transformers saves it) have no "model." prefix.
                rename = lambda name: name.removeprefix("model.")  # noqa: E731
            reader = WeightReader(model_dir, dtype, device, progress, rename)
        model = layout.make_decoder(config, reader) if custom else DecoderModel(config, reader, fuse=fuse_weights, tp=tp, head=not pooling)
        if classifier_tokens is not None:
            no, yes = (vocabulary_id(model_dir, token) for token in classifier_tokens)
            tied = config.tie_word_embeddings or not reader.has("lm_head.weight")
            rows = model.embed if tied else reader.get("lm_head.weight")
            head = ClassifierHead((rows[yes].float() - rows[no].float())[None, :])
        reader.close()
    lora = None
    if opts.max_loras > 0:
        # Before the cache is sized: on CUDA the slot stacks are allocated now. dummy-null checks loads, keeps no weights.
        lora = LoraManager(LoraLayout.of(config, fused=fuse_weights), opts.max_loras, opts.max_lora_rank, device, dtype, keep_weights=not dummy)
    # The draft model, before the cache is sized (on CUDA the free memory counts its weights).
    draft = _load_draft(opts, config, dtype, device, fuse_weights) if opts.speculative_model and not pooling else None
    num_blocks = _num_blocks(opts, local, dtype, device, draft.config if draft else None)
    max_model_len = _max_model_len(opts, config, num_blocks)
    if not dummy:
        cache = KVCache(local, num_blocks, opts.block_size, dtype, device)
        attention = make_backend(attention_backend, cache, local.num_heads, model.scale, config.sliding_windows)
    runner = StepRunner(model, attention, Sampler(opts.seed, device), config.vocab_size, opts.block_size, num_blocks, device)
    if layout is not None:
        runner.embeds_token_ids, runner.deepstack_layers = np.asarray(layout.embeds_token_ids, np.int64), layout.deepstack_layers
    runner.lora = lora
    if layout is not None and layout.cross_attention and cache is not None:
        runner.cross = CrossAttention(cache, local.num_heads)
    if layout is not None and layout.logits_rules is not None:
        runner.logits_rules = layout.logits_rules(model_dir)
    if layout is not None and layout.frames is not None and model is not None:
        runner.frames = layout.frames(model_dir, model)
    if draft is not None:
        draft_cache = KVCache(draft.config, num_blocks, opts.block_size, dtype, device)
        draft_attention = make_backend(attention_backend, draft_cache, draft.config.num_heads, draft.scale, draft.config.sliding_windows)
        runner.proposer = DraftModelProposer(draft, draft_attention, num_blocks, opts.block_size, opts.num_speculative_tokens,
                                             draft.config.max_position_embeddings, device)
    elif opts.num_speculative_tokens > 0 and not pooling:
        runner.proposer = NgramProposer(opts.num_speculative_tokens, opts.prompt_lookup_min, opts.prompt_lookup_max)
    pooling_config = None
    if pooling:
        if classifier_tokens is not None:
            pooling_config = read_classifier_config(model_dir, "last", num_labels=1)
        else:
            pooling_config = read_pooling_config(model_dir, config.hidden_size, encoder=False)
        runner.pooler = ChunkPooler(pooling_config, head)
        return _Decoder(runner, config, num_blocks, max_model_len, dtype, device, cache, pooling_config)
    # Test-only: BATON_TEST_OVERLAP=1 overlaps steps on CPU too (a GPU worker does by default), so the path runs in CI.
    if os.environ.get("BATON_TEST_OVERLAP") == "1" and model is not None and tp is None:
        runner.overlap = True
    if runner.proposer is not None or runner.logits_rules is not None or runner.frames is not None:
        # A step's tokens (and the proposals or the logits rules made from them) are needed on the host before the next.
        runner.overlap = False
    # Captured graphs would have to include the ranks' collectives: tensor parallel decodes run eagerly.
    # With LoRA on none are captured: a replay would run without the step's adapters (their segments change every step).
    # An encoder-decoder's steps run eagerly too: the graphs capture no cross attention.
    # A mixture of experts reads its routing on the host every layer: no graph can capture that.
    if getattr(attention, "name", None) == "triton" and device.type == "cuda" and tp is None and not opts.enforce_eager and lora is None \
            and runner.cross is None and not custom and config.moe is None:
        rows = opts.max_num_seqs * (1 + (opts.num_speculative_tokens if runner.proposer is not None else 0))
        runner.graphs = _capture_graphs(model, attention, -(-max_model_len // opts.block_size), rows)
    return _Decoder(runner, config, num_blocks, max_model_len, dtype, device, cache)


@dataclass
class _Encoder:
    runner: EncoderRunner
    num_blocks: int
    max_model_len: int
    vocab_size: int
    dtype: torch.dtype
    pooling: PoolingConfig


def _load_encoder(opts: WorkerOptions, model_dir: Path, device: torch.device) -> _Encoder:
    """A bidirectional encoder served as a pooling model: no KV cache (see the module docstring)."""
    if opts.load_format != "auto":
        raise ConfigError(f"an encoder loads its weights (--load-format {opts.load_format} is for decoders)")
    config = load_encoder_config(model_dir)
    dtype = resolve_dtype(opts.dtype, None if config.torch_dtype is None else _DtypeOnly(config.torch_dtype), device)
    max_model_len = config.max_model_len
    if opts.max_model_len is not None:
        if opts.max_model_len > max_model_len:
            raise ConfigError(f"--max-model-len {opts.max_model_len} exceeds the encoder's {max_model_len} positions")
        max_model_len = opts.max_model_len
    progress = stderr_progress() if opts.progress else None
    reader = WeightReader(model_dir, dtype, device, progress)
    model = EncoderModel(config, reader, device)
    reader.close()
    separator = None
    if config.classifier:
        pooling = read_classifier_config(model_dir, "cls")
        if model.token_type is not None and model.token_type.shape[0] > 1:
            separator = pair_separator(model_dir)
            if separator is None:
                raise ConfigError(f"{model_dir}: a cross-encoder with token types needs tokenizer.json's pair template (a TemplateProcessing or BertProcessing post-processor)")
    else:
        pooling = read_pooling_config(model_dir, config.hidden_size, encoder=True)
    num_blocks = opts.num_blocks or opts.max_num_seqs * -(-max_model_len // opts.block_size)
    runner = EncoderRunner(model, pooling, config.vocab_size, device, separator)
    return _Encoder(runner, num_blocks, max_model_len, config.vocab_size, dtype, pooling)


@dataclass
class _DtypeOnly:
    """What resolve_dtype reads of a config."""

    torch_dtype: str


def _pooling_info(pooling: PoolingConfig, causal: bool) -> PoolingInfo:
    return PoolingInfo(
        pooling_type=pooling.pooling_type,
        normalize=pooling.normalize,
        dimensions=pooling.dimensions,
        causal=causal,
        is_matryoshka=pooling.is_matryoshka,
        matryoshka_dimensions=list(pooling.matryoshka_dimensions),
        task=pooling.task,
        activation=pooling.activation,
    )


def _kv_connector(opts: WorkerOptions, cache: KVCache | None) -> KvConnectorWorker | None:
    """The KV connector's worker half, when the deployment gives a rendezvous and this worker has a KV cache."""
    if opts.kv_transfer is None or cache is None:
        return None
    backend = "nccl" if cache.layers[0].device.type == "cuda" else "gloo"
    transport = TorchDistributedTransport(opts.kv_transfer, opts.kv_transfer_world, opts.rank, backend)
    # Test-only: BATON_TEST_KV_LOAD_FAIL=1,3 fails this worker's first and third KV loads (after their bytes arrive).
    fail = os.environ.get("BATON_TEST_KV_LOAD_FAIL", "")
    ordinals = frozenset(int(x) for x in fail.split(",") if x.strip().isdigit())
    timeout = float(os.environ.get("BATON_KV_LOAD_TIMEOUT_S", "30"))
    return KvConnectorWorker(cache, transport, load_timeout_s=timeout, fail_load_ordinals=ordinals)


def _config_architecture(model_dir: Path) -> str | None:
    """config.json's architectures[0], or None where there is none to read
    (load_model_config then names what is wrong with the directory)."""
    path = model_dir / "config.json"
    if not path.is_file():
        return None
    architectures = read_json(path).get("architectures") or []
    return architectures[0] if isinstance(architectures, list) and architectures else None


def hosted_nodes(requested: list[str] | None, engines: dict[str, EngineType], model_name: str) -> list[str]:
    """The nodes a worker hosts: --nodes (checked against the model) or every node.
    A worker runs at most one kv_cache node (one decoder, one KV cache)."""
    if requested is None:
        hosted = list(engines)
    else:
        unknown = [name for name in requested if name not in engines]
        if unknown:
            raise ConfigError(
                f"--nodes names {', '.join(map(repr, unknown))}, which {model_name} does not have; "
                f"its nodes: {', '.join(engines)}"
            )
        hosted = list(requested)
    kv = [name for name in hosted if EngineType(engines[name]) is EngineType.KV_CACHE]
    if len(kv) > 1:
        raise ConfigError(
            f"a worker hosts at most one kv_cache node, {model_name} would put {', '.join(kv)} on this one; "
            "place them with --nodes"
        )
    return hosted


def check_tensor_parallel_model(opts: WorkerOptions) -> None:
    """ConfigError unless the model directory is a plain LLM that splits into
    --tensor-parallel-size ranks (checked by rank 0 before it starts the others)."""
    model_dir = Path(opts.model)
    architecture = _config_architecture(model_dir) if model_dir.is_dir() else None
    if graph_model_class(architecture) is not None:
        raise ConfigError(f"--tensor-parallel-size above 1 serves plain LLMs; {architecture} is a graph model")
    check_tensor_parallel(load_model_config(model_dir, lenient=opts.load_format == "dummy-null"), opts.tensor_parallel_size)
    _check_decoder_features(opts, "generate", None, architecture, None)


def _check_decoder_features(opts: WorkerOptions, runner_kind: str, graph_class, architecture: str | None, tp: TensorParallelGroup | None) -> None:
    """ConfigError where LoRA (--max-loras) or speculative decoding (--num-speculative-tokens) is asked
    of something other than a plain generating decoder in one process: both work on its rows only."""
    features = []
    if opts.max_loras:
        features.append((f"--max-loras {opts.max_loras}", "LoRA adapters apply"))
    if opts.num_speculative_tokens:
        features.append((f"--num-speculative-tokens {opts.num_speculative_tokens}", "speculative decoding applies"))
    refused = None
    if runner_kind == "pooling":
        refused = "a pooling model (--runner pooling)"
    elif graph_class is not None:
        refused = f"{architecture}, a graph model"
    elif tp is not None or opts.tensor_parallel_size > 1:
        refused = "--tensor-parallel-size above 1"
    if refused is not None and features:
        flag, what = features[0]
        raise ConfigError(f"{flag}: {what} to a plain generating decoder in one process, not {refused}")


def load_worker(
    opts: WorkerOptions, attention_backend: str | None = None, fuse_weights: bool = True, tp: TensorParallelGroup | None = None
) -> LoadedWorker:
    """attention_backend: auto (cpu on CPU, triton on CUDA), reference, cpu, triton or flex
    (None: opts.attention_backend);
    fuse_weights=False keeps q/k/v and gate/up apart (the pre-fusion path, for benchmarks);
    tp: this process's tensor-parallel rank group (None: the whole model here).

    A directory whose architecture is a registered graph model (models/__init__.py)
    loads that model; any other is a plain LLM, the one-node graph LLMGraphModel."""
    model_dir = Path(opts.model)
    device = resolve_device(opts.device)
    attention_backend = attention_backend or opts.attention_backend
    torch.manual_seed(opts.seed)
    architecture = overridden_architecture(_config_architecture(model_dir) if model_dir.is_dir() else None, opts.hf_overrides or {})
    graph_class = graph_model_class(architecture)
    if opts.model_loader_extra_config and (opts.load_format != "dummy" or graph_class is not None):
        raise ConfigError(f"--model-loader-extra-config applies to --load-format dummy of a plain LLM, not --load-format {opts.load_format}"
                          + (f" of {architecture}, a graph model" if graph_class is not None else ""))

    model_kwargs = opts.model_kwargs or {}
    runner_kind = resolve_runner(opts.runner, model_dir, architecture)
    if runner_kind == "pooling" and (graph_class is not None or tp is not None):
        raise ConfigError(f"--runner pooling serves embedding models on one worker; {architecture or 'this model'} " +
                          ("is a graph model" if graph_class is not None else "with --tensor-parallel-size above 1 is not supported"))
    _check_decoder_features(opts, runner_kind, graph_class, architecture, tp)
    pooling_info = None
    if runner_kind == "pooling" and architecture in ENCODER_ARCHITECTURES:
        hosted_nodes(opts.nodes, NODE_ENGINES, f"{architecture} (a pooling model)")
        encoder = _load_encoder(opts, model_dir, device)
        model = LLMGraphModel(encoder.max_model_len)
        ready = Ready(
            protocol_version=PROTOCOL_VERSION,
            num_blocks=encoder.num_blocks,
            block_size=opts.block_size,
            max_model_len=encoder.max_model_len,
            vocab_size=encoder.vocab_size,
            architecture=architecture,
            dtype=dtype_name(encoder.dtype),
            device=str(device),
            worker_pid=os.getpid(),
            graph=export_graph(model),
            pooling=_pooling_info(encoder.pooling, causal=False),
        )
        nodes = NodeRunner(model, device, [], TensorStore())
        graph_runner = GraphStepRunner(nodes, encoder.runner, LLM_NODE, opts.rank)
        return LoadedWorker(encoder.runner, ready, None, graph_runner, [LLM_NODE])
    if graph_class is None:
        if model_kwargs:
            raise ValueError(
                f"model_kwargs ({', '.join(sorted(model_kwargs))}) are a graph model's constructor arguments; "
                f"{architecture or 'this directory'} is a plain LLM, which takes none"
            )
        hosted_nodes(opts.nodes, NODE_ENGINES, f"{architecture} (a plain LLM)" if architecture else "a plain LLM")
        tokens = opts.hf_overrides["classifier_from_token"] if architecture in DECODER_CLASSIFIERS else None
        decoder = _load_decoder(opts, model_dir, device, attention_backend, fuse_weights, tp, pooling=runner_kind == "pooling", classifier_tokens=tokens)
        if decoder.pooling is not None:
            pooling_info = _pooling_info(decoder.pooling, causal=True)
        model: GraphModel = LLMGraphModel(decoder.max_model_len)
        graph = export_graph(model)
        hosted = [LLM_NODE]
        kv_node: str | None = LLM_NODE
        architecture = architecture if tokens is not None else decoder.config.architecture
    else:
        if tp is not None:
            raise ConfigError(f"--tensor-parallel-size above 1 serves plain LLMs; {architecture} is a graph model")
        try:
            model = graph_class(model_dir, **model_kwargs)
        except TypeError as e:
            # An argument the constructor does not take: say which, as the deployment names it.
            raise ValueError(f"model_kwargs for {architecture}: {e}") from None
        engines = {name: EngineType(kind) for name, kind in model.get_node_engine_types().items()}
        hosted = hosted_nodes(opts.nodes, engines, architecture)
        graph = export_graph(model)  # before any weights: a declaration error fails fast
        kv_node = next((n for n in hosted if engines[n] is EngineType.KV_CACHE), None)
        decoder = None
        if kv_node is not None:
            kv_dir = Path(model.get_kv_model_dir(kv_node))
            decoder = _load_decoder(opts, kv_dir, device, attention_backend, fuse_weights, layout=model.get_kv_decoder_layout(kv_node))

    stateless = [n for n in hosted if n != kv_node]
    nodes = NodeRunner(model, device, stateless, TensorStore())
    arena = ShmArena(opts.shm_bytes) if opts.shm_bytes > 0 else None
    connector = _kv_connector(opts, decoder.cache if decoder else None)
    graph_runner = GraphStepRunner(nodes, decoder.runner if decoder else None, kv_node, opts.rank, arena, connector)
    if decoder is not None:
        sizes = (decoder.num_blocks, decoder.max_model_len, decoder.config.vocab_size, decoder.dtype)
    else:
        # No KV cache here: no blocks, no vocabulary; the lengths are only echoed.
        sizes = (0, opts.max_model_len or 0, 0, resolve_dtype(opts.dtype, None, device))
    num_blocks, max_model_len, vocab_size, dtype = sizes
    ready = Ready(
        protocol_version=PROTOCOL_VERSION,
        num_blocks=num_blocks,
        block_size=opts.block_size,
        max_model_len=max_model_len,
        vocab_size=vocab_size,
        architecture=architecture,
        dtype=dtype_name(dtype),
        device=str(device),
        worker_pid=os.getpid(),
        graph=graph,
        pooling=pooling_info,
    )
    return LoadedWorker(
        decoder.runner if decoder else None, ready, decoder.config if decoder else None, graph_runner, hosted
    )
