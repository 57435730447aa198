"""Generated from protocol/schema.json by scripts/gen-protocol.mjs — do not edit.

The wire's structs and messages as dataclasses (field order is wire order,
defaults from the schema's "defaults"), and the field tables baton_worker.protocol
runs its codec from. Import these through baton_worker.protocol.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PROTOCOL_VERSION", "SamplingParams", "AddedRequest", "StepTimings", "WireValue", "NamedValues", "ChunkPosition", "NodePass", "PassBatch", "PromptRequest", "PromptResult", "ClientChunk", "KvTransfer", "PassResult", "GraphWork", "PoolingInfo", "KvWork", "LoraLoad", "LoraWork", "SpecWork", "Step", "StepMask", "Ping", "Shutdown", "Ready", "StepResult", "Pong", "Fatal", "STRUCT_CLASSES", "MESSAGE_CLASSES"]

PROTOCOL_VERSION = 17


@dataclass
class SamplingParams:
    """temperature 0 means greedy. top_k 0 or -1 means off. top_p 1 and min_p 0 mean off.

    seed nil: the worker's global generator; otherwise a per-request generator seeded once, so the output does not depend on the rest of the batch.

    suppress_token_ids are masked out while the request has fewer than min_tokens output tokens.

    allowed_token_ids, when not empty, are the only tokens the request may sample (vLLM's allowed_token_ids); logit_bias_values[i] is added to the logit of token logit_bias_ids[i] (OpenAI's logit_bias, ids distinct). Both apply after the raw logprobs are taken and before min_tokens suppression and the penalties."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    suppress_token_ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    allowed_token_ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    logit_bias_ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    logit_bias_values: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float32))
    logprobs: int = -1


@dataclass
class AddedRequest:
    """prompt_logprobs: -1 asks for none; k >= 0 asks for the log-probability of every prompt token after the first and the k most likely tokens at each of those positions (StepResult). Raw log-softmax of the model's logits, like SamplingParams.logprobs.

    embeds: -1, or the handle of a tensor in this worker's store with one row per image-token position of the prompt, in order (a vision-language prompt's image features): those rows replace the token embeddings at those positions whenever they are computed. The worker knows the image token id from its model. A frame model (CSM) takes its prompt this way instead: an int64 tensor [num_prompt_tokens, width + 1], each position's frame (the codebook ids, then a text id), and later positions are the frames it sampled.

    positions: -1, or the handle of an int64 tensor [3, num_prompt_tokens] in this worker's store: the prompt's multimodal rotary positions (t, h, w streams; the Qwen2-VL family). Every later token's three positions are its index plus max + 1 - num_prompt_tokens (transformers' rope delta).

    encoder_states / cross_block_ids: an encoder-decoder model's request (Whisper): encoder_states is the handle of a tensor [L, hidden] in this worker's store (the encoder's output for the request) and cross_block_ids the blocks, disjoint from its block table, that hold its cross-attention K/V for positions 0..L-1 (block i: positions [i*block_size, (i+1)*block_size)). The worker computes that K/V when the request is added, before the step's forward pass, and every row of the request attends all L positions. -1 and empty for any other request; the engine allocates and frees those blocks with the request's own."""

    req_id: int
    token_ids: np.ndarray
    num_prompt_tokens: int
    sampling: SamplingParams
    prompt_logprobs: int = -1
    embeds: int = -1
    lora_id: int = 0
    positions: int = -1
    encoder_states: int = -1
    cross_block_ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))


@dataclass
class StepTimings:
    prepare_ms: float = 0.0
    forward_ms: float = 0.0
    sample_ms: float = 0.0


@dataclass
class WireValue:
    form: str
    handle: int = 0
    worker: int = 0
    ids: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    dtype: str = ""
    shape: list[int] = dataclasses.field(default_factory=lambda: [])
    segment: str = ""
    offset: int = 0
    nbytes: int = 0


@dataclass
class NamedValues:
    name: str
    values: list[WireValue]


@dataclass
class ChunkPosition:
    name: str
    index: int
    start: int
    context_count: int
    final: bool


@dataclass
class NodePass:
    pass_id: int
    request_id: int
    inputs: list[NamedValues]
    chunks: list[ChunkPosition] = dataclasses.field(default_factory=lambda: [])
    request_kwargs: Any = dataclasses.field(default_factory=lambda: {})


@dataclass
class PassBatch:
    batch_id: int
    node: str
    walk: str
    passes: list[NodePass]
    publish: list[str] = dataclasses.field(default_factory=lambda: [])


@dataclass
class PromptRequest:
    request_id: int
    prompt: str | None
    input_modalities: list[str]
    output_modalities: list[str]
    kwargs: Any
    publish: list[str] = dataclasses.field(default_factory=lambda: [])


@dataclass
class PromptResult:
    request_id: int
    error: str | None = None
    values: list[NamedValues] = dataclasses.field(default_factory=lambda: [])


@dataclass
class ClientChunk:
    name: str
    modality: str
    data: np.ndarray
    metadata: Any


@dataclass
class KvTransfer:
    transfer_id: int
    request_id: int
    peer_rank: int
    block_ids: np.ndarray
    num_tokens: int


@dataclass
class PassResult:
    pass_id: int
    error: str | None = None
    outputs: list[NamedValues] = dataclasses.field(default_factory=lambda: [])
    client_chunks: list[ClientChunk] = dataclasses.field(default_factory=lambda: [])
    stops: list[str] = dataclasses.field(default_factory=lambda: [])


@dataclass
class GraphWork:
    prompts: list[PromptRequest] = dataclasses.field(default_factory=lambda: [])
    batches: list[PassBatch] = dataclasses.field(default_factory=lambda: [])
    releases: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    finished_requests: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))


@dataclass
class PoolingInfo:
    pooling_type: str
    normalize: bool
    dimensions: int
    causal: bool
    is_matryoshka: bool
    matryoshka_dimensions: list[int]
    task: str
    activation: str


@dataclass
class KvWork:
    sends: list[KvTransfer] = dataclasses.field(default_factory=lambda: [])
    loads: list[KvTransfer] = dataclasses.field(default_factory=lambda: [])
    cancels: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))


@dataclass
class LoraLoad:
    lora_id: int
    name: str
    path: str


@dataclass
class LoraWork:
    loads: list[LoraLoad] = dataclasses.field(default_factory=lambda: [])
    unloads: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))


@dataclass
class SpecWork:
    draft_counts: np.ndarray
    draft_ids: np.ndarray


@dataclass
class Step:
    """Steps are executed strictly in step_id order (ids strictly increase); step_id is echoed in the result. A step may carry only graph work (no rows).

    A request has one id everywhere (req_id, req_ids, request_id, finished_requests): the control plane's request id, unique among live requests.

    removed: worker drops these requests' state first (finished, aborted or preempted). A preempted request comes back later as a new AddedRequest.

    added: requests the worker has not seen; token_ids are all tokens known at admission (prompt, plus earlier outputs for a resumed request); the first num_prompt_tokens of them are the prompt (penalties count only the rest and what is sampled later).

    Rows: req_ids[i] runs num_new_tokens[i] tokens starting at position num_computed[i]; its input tokens are token_ids[num_computed : num_computed + num_new_tokens] of the worker's own token list, which grows by every token the worker samples for it.

    new_block_counts[i] block ids taken in order from new_block_ids are appended to row i's block table before the row runs. KV for position p lives in block_table[p // block_size] at offset p % block_size.

    sample[i] = 1: sample one token from the last position of row i and append it to the request's token list.

    A Step nests by concern: the rows at the top, mask_rows for grammar masks, graph (GraphWork, nil when the step carries none) for the graph runtime, kv (KvWork, nil when none) for the KV connector.

    Graph work, for a worker hosting graph nodes, in this order: releases (the control plane drops its reference to these tensor handles of this worker's store), finished_requests (these requests ended: nodes drop per-request state), prompts (the model's process_prompt per request), the rows above, then each PassBatch (one batched call of a stateless node of one walk, one NodePass per request).

    WireValue form: 'tokens' (ids inline), 'tensor' (handle in the store of worker rank `worker`, with dtype and shape) or 'empty' (a signal). ChunkPosition: a streaming input's chunk: index in its stream, start (offset of its first item), context_count (leading items an earlier chunk already held), final.

    Tensors between workers: PassBatch.publish (PromptRequest.publish) names the outputs (prompt values) a worker of another rank consumes; the producer also copies those tensors into its shared-memory arena and describes the block in the WireValue (file `segment` under /dev/shm, `nbytes` bytes at `offset`; segment '' when not published). The consumer copies the bytes out during its pass; the producer frees the block when the control plane releases the handle, which it does only after every pass reading it has answered. A tensor that does not fit the arena fails its request only.

    mask_rows: sampled rows (indices among the rows with sample = 1, in row order) whose logits are masked by a grammar before sampling; their masks come in a StepMask with this step_id, which the worker waits for after the forward pass (the engine computes a row's mask only once the token before it is known, so with two steps in flight the forward runs while the mask is made).

    KV connector (prefill/decode disaggregation): kv.sends (prefill worker) and kv.loads (decode worker) name the same transfer_id, the tag both sides use in the transfer library; block_ids are the sender's source blocks or the receiver's destination blocks, in the same order, covering the first num_tokens positions of request_id. A sender copies its blocks out when the step arrives and sends them asynchronously; a receiver receives them asynchronously and writes them into its cache only after applying the kv.cancels of a later step (transfer ids whose request ended: their blocks may belong to another request now), so a load reported in a StepResult is in the cache before any later step runs.

    lora (LoraWork, nil when the step carries none): LoRA adapters, loads before anything else in the step (lora_id >= 1 names the PEFT directory at path; a load that fails is answered in StepResult.lora_load_failed / lora_load_errors, one line naming the problem, and that id stays unknown); unloads after the step's removed (no request live after them may use the id). AddedRequest.lora_id is the adapter every row of that request runs with (0: the base model); a step's rows use at most the worker's --max-loras distinct adapters.

    spec (SpecWork, nil when no row carries drafts): speculative decoding. draft_counts[i] draft tokens, taken in order from draft_ids, follow row i's known tokens: the row runs num_new_tokens[i] = (its tokens from num_computed) + draft_counts[i] positions, the drafts last, and samples (sample[i] = 1) at its last known token and at every draft. The worker verifies the drafts (greedy: a draft is accepted while it equals the token the target samples before it) and appends the accepted drafts and the token sampled after them; KV written for rejected drafts is ignored (those positions are recomputed later). Only rows whose sampling the worker can verify carry drafts."""

    step_id: int
    added: list[AddedRequest]
    removed: np.ndarray
    req_ids: np.ndarray
    num_new_tokens: np.ndarray
    num_computed: np.ndarray
    new_block_counts: np.ndarray
    new_block_ids: np.ndarray
    sample: np.ndarray
    mask_rows: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    graph: GraphWork | None = None
    kv: KvWork | None = None
    lora: LoraWork | None = None
    spec: SpecWork | None = None


@dataclass
class StepMask:
    """bitmask: len(mask_rows) rows of ceil(vocab_size / 32) words; bit j of word w of row r allows token 32 * w + j for sampled row mask_rows[r] (xgrammar's layout). Every other token's logit becomes -inf before sampling (and before logprobs are taken)."""

    step_id: int
    bitmask: np.ndarray


@dataclass
class Ping:
    nonce: int


@dataclass
class Shutdown:
    pass


@dataclass
class Ready:
    """pooling: nil for a generating model; for a pooling model (--runner pooling) how its prompt becomes one vector. Every request of such a worker is prefill only: the row that reaches the end of its prompt (sample = 1) is pooled instead of sampled (StepResult.pooled). pooling_type: cls (first position), mean (every position) or last (last position) of the last hidden layer; normalize: the vector is L2-normalized; dimensions: its length; causal false: a bidirectional encoder, which needs a request's whole prompt in one row (never chunked, never a prefix-cache hit) and keeps no KV (num_blocks only counts for the scheduler); is_matryoshka / matryoshka_dimensions: the model's config allows truncating the vector (to those lengths only, when listed). task: embed (the vector is an embedding) or classify (a cross-encoder or reranker: the vector is its dimensions logits, /score and /rerank serve it); activation: what turns a classifier's logit into its score, sigmoid or identity (identity for embed).

    graph: the model's graph of nodes and walks as data (layout in docs/graph-runtime.md; validated and compiled by src/graph/ at start-up). A plain LLM is the one-node graph: node llm, walks prefill and decode."""

    protocol_version: int
    num_blocks: int
    block_size: int
    max_model_len: int
    vocab_size: int
    architecture: str
    dtype: str
    device: str
    worker_pid: int
    graph: Any
    pooling: PoolingInfo | None = None


@dataclass
class StepResult:
    """req_ids / token_ids: one entry per sampled row, in row order.

    logprobs: each token's log-probability, one entry per token of token_ids, nil when no row asked (SamplingParams.logprobs < 0).

    top_counts[i] entries of top_ids / top_logprobs belong to token i of token_ids (SamplingParams.logprobs > 0 asks for that many).

    prompt_results: one per prompt request, in order: its values by name (a 1-D integer tensor as 'tokens'; other tensors stay in this worker's store as 'tensor' with one reference, the control plane's), or the error that refuses the request.

    pass_results: one per pass of every batch, in order: stored outputs by name (one reference each, the control plane's), client_chunks (outputs bound for the client, already postprocessed to bytes), the loops the pass stops, or the error that fails its request.

    Prompt logprobs (AddedRequest.prompt_logprobs >= 0): prompt_counts has one entry per row of the step (nil when no row asks); row i covers prompt_counts[i] positions p = num_computed[i], num_computed[i] + 1, ..., each with the log-probability of prompt token p + 1 given tokens 0..p. Only positions p < num_prompt_tokens - 1 count (the last prompt position predicts the first output token, which is sampled).

    prompt_logprobs / prompt_ranks: one entry per such position, rows in order: the prompt token's log-probability and its rank (1 + the number of tokens more likely). prompt_top_ids / prompt_top_logprobs: k entries per position, most likely first, where k = min(AddedRequest.prompt_logprobs, vocab size) of the row's request.

    token_counts (nil: one token per sampled row): how many of token_ids each sampled row appended, in row order (a row with drafts: its accepted drafts plus one). draft_counts / draft_ids (nil: no proposals): the worker's proposals (speculative decoding, --speculative-config) for each sampled row's next step, draft_counts[i] ids each, in row order; the engine may schedule fewer.

    frames (nil: none): a frame model's (CSM's) whole frame for each sampled row, width ids a row, in row order (width = len(frames) / len(token_ids)); token_ids then holds what the engine counts and stops on: codebook 0, or the stop id for a stop frame."""

    step_id: int
    req_ids: np.ndarray
    token_ids: np.ndarray
    logprobs: np.ndarray | None
    top_counts: np.ndarray | None
    top_ids: np.ndarray | None
    top_logprobs: np.ndarray | None
    timings: StepTimings
    prompt_results: list[PromptResult] = dataclasses.field(default_factory=lambda: [])
    pass_results: list[PassResult] = dataclasses.field(default_factory=lambda: [])
    prompt_counts: np.ndarray | None = None
    prompt_logprobs: np.ndarray | None = None
    prompt_ranks: np.ndarray | None = None
    prompt_top_ids: np.ndarray | None = None
    prompt_top_logprobs: np.ndarray | None = None
    kv_loaded: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    kv_load_failed: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    kv_load_errors: list[str] = dataclasses.field(default_factory=lambda: [])
    kv_bytes: int = 0
    pooled: np.ndarray | None = None
    lora_load_failed: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    lora_load_errors: list[str] = dataclasses.field(default_factory=lambda: [])
    token_counts: np.ndarray | None = None
    draft_counts: np.ndarray | None = None
    draft_ids: np.ndarray | None = None
    frames: np.ndarray | None = None


@dataclass
class Pong:
    nonce: int


@dataclass
class Fatal:
    """The worker cannot go on (for example it cannot load the model); it exits non-zero right after sending this."""

    message: str


STRUCT_CLASSES: dict[str, type] = {"SamplingParams": SamplingParams, "AddedRequest": AddedRequest, "StepTimings": StepTimings, "WireValue": WireValue, "NamedValues": NamedValues, "ChunkPosition": ChunkPosition, "NodePass": NodePass, "PassBatch": PassBatch, "PromptRequest": PromptRequest, "PromptResult": PromptResult, "ClientChunk": ClientChunk, "KvTransfer": KvTransfer, "PassResult": PassResult, "GraphWork": GraphWork, "PoolingInfo": PoolingInfo, "KvWork": KvWork, "LoraLoad": LoraLoad, "LoraWork": LoraWork, "SpecWork": SpecWork}
MESSAGE_CLASSES: dict[str, type] = {"Step": Step, "StepMask": StepMask, "Ping": Ping, "Shutdown": Shutdown, "Ready": Ready, "StepResult": StepResult, "Pong": Pong, "Fatal": Fatal}

# Wire layout, in field order: (name, type, nullable, struct name or None).
FieldSpec = tuple[str, str, bool, str | None]
STRUCT_FIELDS: dict[str, tuple[FieldSpec, ...]] = {
    "SamplingParams": (
        ("temperature", "float", False, None),
        ("top_p", "float", False, None),
        ("top_k", "int", False, None),
        ("min_p", "float", False, None),
        ("seed", "int", True, None),
        ("presence_penalty", "float", False, None),
        ("frequency_penalty", "float", False, None),
        ("repetition_penalty", "float", False, None),
        ("min_tokens", "int", False, None),
        ("suppress_token_ids", "i32[]", False, None),
        ("allowed_token_ids", "i32[]", False, None),
        ("logit_bias_ids", "i32[]", False, None),
        ("logit_bias_values", "f32[]", False, None),
        ("logprobs", "int", False, None),
    ),
    "AddedRequest": (
        ("req_id", "int", False, None),
        ("token_ids", "i32[]", False, None),
        ("num_prompt_tokens", "int", False, None),
        ("sampling", "struct", False, "SamplingParams"),
        ("prompt_logprobs", "int", False, None),
        ("embeds", "int", False, None),
        ("lora_id", "int", False, None),
        ("positions", "int", False, None),
        ("encoder_states", "int", False, None),
        ("cross_block_ids", "i32[]", False, None),
    ),
    "StepTimings": (
        ("prepare_ms", "float", False, None),
        ("forward_ms", "float", False, None),
        ("sample_ms", "float", False, None),
    ),
    "WireValue": (
        ("form", "str", False, None),
        ("handle", "int", False, None),
        ("worker", "int", False, None),
        ("ids", "i32[]", False, None),
        ("dtype", "str", False, None),
        ("shape", "int[]", False, None),
        ("segment", "str", False, None),
        ("offset", "int", False, None),
        ("nbytes", "int", False, None),
    ),
    "NamedValues": (
        ("name", "str", False, None),
        ("values", "struct[]", False, "WireValue"),
    ),
    "ChunkPosition": (
        ("name", "str", False, None),
        ("index", "int", False, None),
        ("start", "int", False, None),
        ("context_count", "int", False, None),
        ("final", "bool", False, None),
    ),
    "NodePass": (
        ("pass_id", "int", False, None),
        ("request_id", "int", False, None),
        ("inputs", "struct[]", False, "NamedValues"),
        ("chunks", "struct[]", False, "ChunkPosition"),
        ("request_kwargs", "any", False, None),
    ),
    "PassBatch": (
        ("batch_id", "int", False, None),
        ("node", "str", False, None),
        ("walk", "str", False, None),
        ("passes", "struct[]", False, "NodePass"),
        ("publish", "str[]", False, None),
    ),
    "PromptRequest": (
        ("request_id", "int", False, None),
        ("prompt", "str", True, None),
        ("input_modalities", "str[]", False, None),
        ("output_modalities", "str[]", False, None),
        ("kwargs", "any", False, None),
        ("publish", "str[]", False, None),
    ),
    "PromptResult": (
        ("request_id", "int", False, None),
        ("error", "str", True, None),
        ("values", "struct[]", False, "NamedValues"),
    ),
    "ClientChunk": (
        ("name", "str", False, None),
        ("modality", "str", False, None),
        ("data", "u8[]", False, None),
        ("metadata", "any", False, None),
    ),
    "KvTransfer": (
        ("transfer_id", "int", False, None),
        ("request_id", "int", False, None),
        ("peer_rank", "int", False, None),
        ("block_ids", "i32[]", False, None),
        ("num_tokens", "int", False, None),
    ),
    "PassResult": (
        ("pass_id", "int", False, None),
        ("error", "str", True, None),
        ("outputs", "struct[]", False, "NamedValues"),
        ("client_chunks", "struct[]", False, "ClientChunk"),
        ("stops", "str[]", False, None),
    ),
    "GraphWork": (
        ("prompts", "struct[]", False, "PromptRequest"),
        ("batches", "struct[]", False, "PassBatch"),
        ("releases", "i32[]", False, None),
        ("finished_requests", "i32[]", False, None),
    ),
    "PoolingInfo": (
        ("pooling_type", "str", False, None),
        ("normalize", "bool", False, None),
        ("dimensions", "int", False, None),
        ("causal", "bool", False, None),
        ("is_matryoshka", "bool", False, None),
        ("matryoshka_dimensions", "int[]", False, None),
        ("task", "str", False, None),
        ("activation", "str", False, None),
    ),
    "KvWork": (
        ("sends", "struct[]", False, "KvTransfer"),
        ("loads", "struct[]", False, "KvTransfer"),
        ("cancels", "i32[]", False, None),
    ),
    "LoraLoad": (
        ("lora_id", "int", False, None),
        ("name", "str", False, None),
        ("path", "str", False, None),
    ),
    "LoraWork": (
        ("loads", "struct[]", False, "LoraLoad"),
        ("unloads", "i32[]", False, None),
    ),
    "SpecWork": (
        ("draft_counts", "i32[]", False, None),
        ("draft_ids", "i32[]", False, None),
    ),
}
# name -> (tag, sender, fields)
MESSAGE_SPECS: dict[str, tuple[str, str, tuple[FieldSpec, ...]]] = {
    "Step": (
        "step",
        "engine",
        (
            ("step_id", "int", False, None),
            ("added", "struct[]", False, "AddedRequest"),
            ("removed", "i32[]", False, None),
            ("req_ids", "i32[]", False, None),
            ("num_new_tokens", "i32[]", False, None),
            ("num_computed", "i32[]", False, None),
            ("new_block_counts", "i32[]", False, None),
            ("new_block_ids", "i32[]", False, None),
            ("sample", "u8[]", False, None),
            ("mask_rows", "i32[]", False, None),
            ("graph", "struct", True, "GraphWork"),
            ("kv", "struct", True, "KvWork"),
            ("lora", "struct", True, "LoraWork"),
            ("spec", "struct", True, "SpecWork"),
        ),
    ),
    "StepMask": (
        "step_mask",
        "engine",
        (
            ("step_id", "int", False, None),
            ("bitmask", "i32[]", False, None),
        ),
    ),
    "Ping": (
        "ping",
        "engine",
        (
            ("nonce", "int", False, None),
        ),
    ),
    "Shutdown": (
        "shutdown",
        "engine",
        (),
    ),
    "Ready": (
        "ready",
        "worker",
        (
            ("protocol_version", "int", False, None),
            ("num_blocks", "int", False, None),
            ("block_size", "int", False, None),
            ("max_model_len", "int", False, None),
            ("vocab_size", "int", False, None),
            ("architecture", "str", False, None),
            ("dtype", "str", False, None),
            ("device", "str", False, None),
            ("worker_pid", "int", False, None),
            ("graph", "any", False, None),
            ("pooling", "struct", True, "PoolingInfo"),
        ),
    ),
    "StepResult": (
        "result",
        "worker",
        (
            ("step_id", "int", False, None),
            ("req_ids", "i32[]", False, None),
            ("token_ids", "i32[]", False, None),
            ("logprobs", "f32[]", True, None),
            ("top_counts", "i32[]", True, None),
            ("top_ids", "i32[]", True, None),
            ("top_logprobs", "f32[]", True, None),
            ("timings", "struct", False, "StepTimings"),
            ("prompt_results", "struct[]", False, "PromptResult"),
            ("pass_results", "struct[]", False, "PassResult"),
            ("prompt_counts", "i32[]", True, None),
            ("prompt_logprobs", "f32[]", True, None),
            ("prompt_ranks", "i32[]", True, None),
            ("prompt_top_ids", "i32[]", True, None),
            ("prompt_top_logprobs", "f32[]", True, None),
            ("kv_loaded", "i32[]", False, None),
            ("kv_load_failed", "i32[]", False, None),
            ("kv_load_errors", "str[]", False, None),
            ("kv_bytes", "int", False, None),
            ("pooled", "f32[]", True, None),
            ("lora_load_failed", "i32[]", False, None),
            ("lora_load_errors", "str[]", False, None),
            ("token_counts", "i32[]", True, None),
            ("draft_counts", "i32[]", True, None),
            ("draft_ids", "i32[]", True, None),
            ("frames", "i32[]", True, None),
        ),
    ),
    "Pong": (
        "pong",
        "worker",
        (
            ("nonce", "int", False, None),
        ),
    ),
    "Fatal": (
        "fatal",
        "worker",
        (
            ("message", "str", False, None),
        ),
    ),
}
