"""Executes one Step: apply its deltas to the persistent batch, build the
step's inputs in one vectorized pass, run the model once over every row
(prefill chunks and decodes together), sample the rows that ask for it, and
answer with a StepResult.

The engine owns scheduling and block allocation; this module only checks that
what it is told is consistent (unknown request, too few blocks, a block id out
of range, ...) and reports violations as ProtocolError naming the field.
Per-row Python work is limited to added/removed requests, to handing the
sampler its list of sampling rows and to the rows of requests that asked for
prompt logprobs; the rest works on whole columns.

Prompt logprobs: a row of a request that asked for them (AddedRequest.
prompt_logprobs >= 0) also gets the log-softmax at each of its prompt
positions but the last (position p scores prompt token p + 1). The forward
keeps the last layer's hidden rows, and the logits of those positions are
computed from them in slices, so a long prompt never holds [tokens, vocab]
logits at once.

Pooling (a decoder served with --runner pooling, `pooler` set): no logits and
no sampling; the rows that reach the end of their prompt answer with their
pooled vectors (StepResult.pooled), from the last hidden states after the
final norm, chunk by chunk (model/pooling.py ChunkPooler).

LoRA (--max-loras above 0, `lora` set): a step's Step.lora loads come before
anything else, its unloads after the step's removals (a failed load is
answered in the result's lora_load_failed / lora_load_errors). Each request keeps the
adapter it was added with (AddedRequest.lora_id, 0: the base model); a step
whose rows use an adapter gets a LoraBatch (lora/batch.py) for its forward
pass, built from the adapter of each packed token. The protocol's rules are
checked here: an unknown adapter, an unload of one a live request uses, more
distinct adapters in a step than --max-loras, any LoRA on a worker without it.

Encoder-decoder models (Whisper: `cross` set): a request added with
AddedRequest.encoder_states gets its cross-attention K/V computed from that
tensor into its cross_block_ids before the step's forward pass (the K/V of
every request added in the step, one projection per layer), and every row of
the step cross-attends its request's blocks (attention/cross.py). The model's
logits rules (`logits_rules`: Whisper's token suppression and timestamp
rules) edit the sampled rows' logits before sampling, reading each row's
tokens so far; such a runner never overlaps steps, so those tokens are on the
host.

Speculative decoding (--num-speculative-tokens K above 0, `proposer` set; no
overlap): after every step the worker proposes up to K drafts for each
sampled row it can verify from each position's logits alone (greedy or
sampled, logprobs too; no penalties or logit edits; n-gram prompt lookup,
spec/ngram.py, or a draft model, spec/draft_model.py) in StepResult.draft_counts /
draft_ids. A step's Step.spec puts drafts after a row's known tokens: they are
written after the row's tokens in the persistent batch (not counted in its
length) so the inputs read them, the forward computes float32 logits at the
row's last known token and at every draft, each position draws its token as
the row would without drafts (argmax, or the sampler with that position's
output index: _targets), and a draft is kept while it equals the token drawn
(_verified): the accepted drafts and the token after them are appended
at once (StepResult.token_counts). The step's other sampled rows sample as in
any step (from their own logits rows, screened or not). On CUDA a step with
drafts whose rows all decode (one known token and its drafts each) replays the
decode graphs with every token as a row (DecodeGraphs.verify); one with a
prefill chunk runs eagerly.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..attention import AttentionBackend
from ..attention.cross import CrossAttention, with_cross
from ..lora import LoraBatch, LoraManager
from ..model.decoder import DecoderModel
from ..model.pooling import ChunkPooler, pooled_result
from ..protocol import ProtocolError, SamplingParams, Step, StepMask, StepResult, StepTimings
from ..sampling.head_screen import SPLIT_ROWS, screens
from ..sampling.sampler import PendingSample, SampleOutput, Sampler, TokenMask, first_argmax, is_greedy, penalizes
from ..sampling.token_bitmask import words_per_row
from ..spec.draft_model import DraftModelProposer
from ..spec.ngram import NgramProposer
from .cpu_threads import CpuThreads
from .persistent_batch import PersistentBatch, StepInputs
from .request_state import RequestState

_ROW_FIELDS = ("num_new_tokens", "num_computed", "new_block_counts", "sample")

# Prompt positions whose logits are materialised at once: about this many floats.
_PROMPT_SLICE_FLOATS = 1 << 24


# A sampled token's place, reserved at launch until its value reaches the host.
PLACEHOLDER = -1


@dataclass
class LaunchedStep:
    """A step whose forward pass and sampling are queued on the device."""

    runner: StepRunner
    step_id: int
    req_ids: np.ndarray  # the sampled rows' requests
    sampled: list[RequestState]
    slots: np.ndarray  # the sampled rows' slots
    positions: np.ndarray  # where each sampled token goes in its request
    pending: PendingSample
    removals: int  # the runner's removal count at launch: unchanged at finish, every slot is still its request's
    prompt_out: PromptLogprobs | None
    times: tuple[float, float, float]  # perf_counter at the start, after the inputs, after the forward pass
    lora_failed: tuple[np.ndarray, list[str]] | None = None  # the step's failed adapter loads: ids and their lines
    # Speculative decoding: tokens appended per sampled row (None: one each, in their reserved places;
    # otherwise every token is in place already), and which sampled rows get proposals (None: speculation off).
    token_counts: np.ndarray | None = None
    speculable: np.ndarray | None = None
    frames: np.ndarray | None = None  # a frame model's sampled frames [rows, width] (StepResult.frames)

    def done(self) -> bool:
        """Whether the tokens are on the host (finish() would not wait)."""
        return self.pending.done()

    def finish(self) -> StepResult:
        return self.runner.finish(self)


class Finished:
    """A step already run (a pooling step; a graph step without rows): its result, as a launched step's."""

    def __init__(self, result: StepResult):
        self.result = result

    def done(self) -> bool:
        return True

    def finish(self) -> StepResult:
        return self.result


@dataclass
class PromptRows:
    """The step's prompt positions that want logprobs, in row order."""

    counts: np.ndarray  # int32 [rows of the step]: positions per row
    token_index: np.ndarray  # int64 [positions]: index into the step's flattened tokens
    targets: np.ndarray  # int64 [positions]: the prompt token each position scores
    ks: np.ndarray  # int64 [positions]: alternatives wanted at each position


@dataclass
class _VerifyPosition:
    """A sampled draft row at one verify position, as the sampler reads a request: its parameters and
    the output index the token there would have (verification excludes rows whose logits the
    sampler edits, so nothing else is read)."""

    sampling: SamplingParams
    num_output_tokens: int


@dataclass
class SpecRows:
    """A step's rows with drafts (Step.spec), as the forward pass and the verification see them."""

    drafted: np.ndarray  # int64 [draft rows]: their indices among the sampled rows
    rest: np.ndarray  # int64: the other sampled rows' indices, sampled as in any step
    counts: np.ndarray  # int64 [draft rows]: drafts per draft row
    draft_ids: np.ndarray  # int64 [sum of counts]: the drafts, row after row
    index: np.ndarray  # int64 [sum of counts + 1]: the flattened tokens whose logits verify them
    targets: np.ndarray | None = None  # int64 [same]: the token each of those positions draws
    drawn: SampleOutput | None = None  # the sampler's output for those positions (their logprobs), when it ran
    head_logits: torch.Tensor | None = None  # the other sampled rows' logits, when the decode graphs ran the step


@dataclass
class PromptLogprobs:
    counts: np.ndarray  # int32 [rows]
    logprobs: np.ndarray  # float32 [positions]
    ranks: np.ndarray  # int32 [positions]
    top_ids: np.ndarray  # int32 [sum of ks]
    top_logprobs: np.ndarray  # float32 [sum of ks]


class StepRunner:
    def __init__(
        self,
        model: DecoderModel | None,
        attention: AttentionBackend | None,
        sampler: Sampler,
        vocab_size: int,
        block_size: int,
        num_blocks: int,
        device: torch.device,
    ):
        self.model = model  # None: the dummy-null load format (no forward pass)
        self.attention = attention
        self.sampler = sampler
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = device
        self.requests: dict[int, RequestState] = {}
        self.slot_of: dict[int, int] = {}  # req_id -> slot
        # slot_of as sorted columns (req ids, their slots), rebuilt after adds and
        # removals: one searchsorted maps a step's rows to slots.
        self._slot_index: tuple[np.ndarray, np.ndarray] | None = None
        self.by_slot: dict[int, RequestState] = {}
        self.batch = PersistentBatch(block_size, device)
        self.graphs = None  # cuda_graphs.DecodeGraphs, set by loading on CUDA
        # Overlap: a step may be launched before the previous one finishes (overlaps()),
        # so the host prepares step N+1 while the GPU runs N. Where compute is
        # synchronous (CPU) there is nothing to overlap.
        self.overlap = device.type == "cuda" and model is not None and model.tp is None
        self.penalized: set[int] = set()  # requests whose sampling reads their earlier tokens' values
        self.removals = 0  # requests removed so far (a launched step checks its slots only if some were)
        self.last_tokens: torch.Tensor | None = None  # [slots] each slot's latest sampled token, on the device
        # On CPU: torch's threads per phase of a step (cpu_threads.py); the worker's share of the cores is set by now.
        self.cpu = CpuThreads(torch.get_num_threads()) if device.type == "cpu" else None
        # Slots of requests that want prompt logprobs, until their prompt is computed.
        self.prompt_slots: set[int] = set()
        # Prompt embeddings (AddedRequest.embeds): the tokens they replace, the deepstack rows each
        # carries after its own (KvDecoderLayout), how a handle resolves to its tensor (the graph
        # worker's store), and per slot the replaced positions with their rows.
        self.embeds_token_ids = np.zeros(0, np.int64)
        self.deepstack_layers = 0
        self.embeds_of: Callable[[int], torch.Tensor] | None = None
        self.embeds: dict[int, tuple[np.ndarray, torch.Tensor]] = {}
        # Per slot, a multimodal-rotary request's prompt positions [3, prompt] and the offset of every later
        # position (AddedRequest.positions).
        self.mrope: dict[int, tuple[np.ndarray, int]] = {}
        # A pooling model's pooler (None: the model generates).
        self.pooler: ChunkPooler | None = None
        # LoRA adapters (None: --max-loras 0), the live requests per adapter id, and each slot's adapter (0: base model).
        self.lora: LoraManager | None = None
        self.lora_users: dict[int, int] = {}
        self.slot_lora = np.zeros(0, np.int32)
        # Speculative decoding's draft proposer (None: --num-speculative-tokens 0, Step.spec refused).
        self.proposer: NgramProposer | DraftModelProposer | None = None
        # An encoder-decoder model's cross attention (None: a decoder-only model), each slot's cross blocks and
        # positions, and the requests added since the last forward whose cross K/V is still to be written.
        self.cross: CrossAttention | None = None
        self.cross_blocks: dict[int, tuple[np.ndarray, int]] = {}
        self.cross_pending: dict[int, torch.Tensor] = {}
        # Edits the sampled rows' logits from their tokens so far (a model's own generation rules), or None.
        self.logits_rules = None
        # A frame model's inputs and its frames' other codebooks (CSM: models/csm/steps.py CsmFrames), or None.
        self.frames = None

    def execute(self, step: Step, wait_mask: Callable[[int], StepMask] | None = None) -> StepResult:
        """Runs the step. A step with mask_rows needs wait_mask: after the forward
        pass it is called with the step id and returns the StepMask that the
        engine sends once it knows the tokens before those rows."""
        return self.launch(step, wait_mask).finish()

    def overlaps(self, step: Step) -> bool:
        """Whether `step` may be launched while the previous step is not finished
        (its tokens not on the host yet). Its rows read the previous step's tokens
        on the device; what needs them on the host must wait: grammar masks (the
        engine makes them from the tokens), penalties (counted from the tokens),
        prompt logprobs, and tensor parallelism (rank 0 broadcasts host tokens)."""
        if not self.overlap or len(step.mask_rows) or self.prompt_slots or self.pooler is not None or step.lora is not None \
                or self.proposer is not None:
            return False
        if self.penalized and any(r in self.penalized for r in step.req_ids.tolist()):
            return False
        return not any(penalizes(a.sampling) or a.prompt_logprobs >= 0 for a in step.added)

    def launch(self, step: Step, wait_mask: Callable[[int], StepMask] | None = None) -> LaunchedStep | Finished:
        """Everything of the step up to its sampled tokens on the device, and their
        copy to the host queued; finish() waits for them. The sampled rows' next
        positions are reserved at once (PLACEHOLDER on the host, the token in
        last_tokens on the device), so a next step can be checked and built now."""
        t0 = time.perf_counter()
        lora_failed = self._lora_loads(step) if step.lora is not None else None
        self._remove(step)
        if step.lora is not None:
            # After the removals: the step that removes an adapter's last request may unload it.
            self._lora_unloads(step)
        self._add(step)
        drafts = self._drafts(step) if step.spec is not None else None
        slots, start, num_new, sample = self._rows(step, drafts)
        if drafts is not None:
            self.batch.write_drafts(slots, drafts, step.spec.draft_ids)
        inputs = self.batch.inputs(slots, start, num_new, sample)
        streams = False
        if self.mrope:
            inputs, streams = self._rotary_positions(inputs)
        lora = self._lora_batch(slots, inputs) if self.lora_users else None
        if self.pooler is not None:
            return Finished(self._pool(step, inputs, slots, start, num_new, sample, t0))
        sample_slots = slots[sample]
        sampled = [self.by_slot[s] for s in sample_slots.tolist()]
        # With drafts the sampler sees the other sampled rows only (head_*); the draft rows are verified.
        spec = self._spec_rows(step, drafts, num_new, sample, inputs, sampled) if drafts is not None else None
        head_inputs, head_sampled, head_masks = inputs, sampled, step.mask_rows
        if spec is not None:
            rest = torch.from_numpy(spec.rest).to(inputs.logits_indices.device)
            head_inputs = dataclasses.replace(inputs, logits_indices=inputs.logits_indices.index_select(0, rest),
                                              logits_indices_host=inputs.logits_indices_host[spec.rest])
            head_sampled = [sampled[i] for i in spec.rest.tolist()]
            head_masks = np.searchsorted(spec.rest, step.mask_rows)
        prompt = self._prompt_rows(slots, start, num_new) if self.prompt_slots else None
        replace = self._replaced_rows(slots, start, num_new) if self.embeds else None
        if self.frames is not None and len(slots):
            replace = self.frames.inputs(slots, start, num_new)
        if self.model is not None and len(inputs.input_ids_host) and inputs.input_ids_host.min() < 0:
            self._fill_from_device(inputs)
        if self.cross_pending:
            self._write_cross()
        t1 = time.perf_counter()
        logits = None
        frame_h = None
        frames = None  # a frame model's sampled frames
        head_rows = None  # with a screen: the head's input rows, which sampled rows it decides, and its shares
        prompt_out = None
        if self.model is not None and len(inputs.input_ids_host):
            graphed = self.graphs is not None and replace is None and prompt is None and lora is None and not streams
            if graphed and spec is None:
                logits = self.graphs.run(inputs)
                graphed = logits is not None
            elif graphed:
                graphed = self._verify_graphed(spec, drafts, num_new, inputs, head_inputs, bool(head_sampled), sampled)
                logits = spec.head_logits
            if not graphed:
                screened = self._screened(head_sampled, head_masks) if prompt is None and self.frames is None else None
                shares = 1
                if self.cpu is not None:
                    shares = self.cpu.for_step(len(inputs.input_ids_host), 0 if screened is None else len(screened), SPLIT_ROWS,
                                               layers_alone=self.cross is not None or self.frames is not None)
                attention = self.attention.prepare(inputs.attention)
                if self.cross is not None:
                    attention = with_cross(attention, self._cross_plan(slots, inputs))
                if replace is not None and self.deepstack_layers:
                    index, rows = replace
                    split = rows.split(self.model.config.hidden_size, dim=1)
                    hidden = self.model.hidden_states(inputs.input_ids, inputs.positions, attention, (index, split[0]), lora,
                                                      deepstack=(index, list(split[1:])))
                else:
                    hidden = self.model.hidden_states(inputs.input_ids, inputs.positions, attention, replace, lora)
                if screened is not None:
                    head_rows = (self.model.head_input(hidden, head_inputs.logits_indices), screened, shares)
                elif self.frames is not None:
                    # The final-norm rows score codebook 0 and start the depth decoder after the draw.
                    frame_h = self.model.head_input(hidden, head_inputs.logits_indices)
                    logits = self.model.codebook0_logits(frame_h)
                elif head_sampled or spec is None:
                    if self.cpu is not None and self.cross is not None:
                        self.cpu.for_head()
                    logits = self.model.logits(hidden, head_inputs.logits_indices)
                if spec is not None:
                    index = torch.from_numpy(spec.index).to(hidden.device)
                    spec.targets = self._targets(self.model.logits(hidden, index), spec, sampled)
                if prompt is not None:
                    prompt_out = self._prompt_logprobs(hidden, prompt)
        elif prompt is not None:
            # dummy-null: no model, so every prompt position scores 0 with no alternatives.
            total = len(prompt.targets)
            prompt_out = PromptLogprobs(prompt.counts, np.zeros(total, np.float32), np.ones(total, np.int32), np.zeros(0, np.int32), np.zeros(0, np.float32))
        t2 = time.perf_counter()
        tp = self.model.tp if self.model is not None else None
        if tp is None or tp.is_driver:
            # Waiting for a grammar mask counts as sampling time: the forward pass is done.
            token_mask = self._token_mask(step, len(sampled), wait_mask)
            if spec is not None and token_mask is not None:
                token_mask = TokenMask(head_masks.astype(np.int64), token_mask.bitmask)
            if head_rows is not None:
                pending = PendingSample.ready(self._sample_screened(*head_rows, head_sampled, token_mask))
            else:
                if self.logits_rules is not None and logits is not None and head_sampled:
                    logits = self.logits_rules.apply(logits, [(st.token_ids, st.num_prompt_tokens) for st in head_sampled])
                pending = self._sample(logits, head_sampled, head_inputs, token_mask)
                if frame_h is not None and head_sampled:
                    out = pending.read()
                    out.token_ids, frames = self.frames.sample(frame_h, out.token_ids, head_sampled)
                    pending = PendingSample.ready(out)
        else:
            # Rank 0 samples (it alone has the logits and the grammar masks); here only its ids matter.
            pending = PendingSample.ready(SampleOutput(np.zeros(0, np.int32), None, None, None, None))
        if tp is not None:
            out = pending.read()
            out.token_ids = tp.broadcast_tokens(out.token_ids if tp.is_driver else None, len(sample_slots))
            pending = PendingSample.ready(out)
        if self.frames is not None and tp is not None:
            raise ProtocolError("Step", "a frame model runs without tensor parallelism")
        positions = self.batch.lengths[sample_slots].copy()
        speculable = self._speculable(sampled, step.mask_rows) if self.proposer is not None else None
        if spec is not None:
            if spec.targets is None:
                # dummy-null: the "model" predicts (input token + 1) % vocab at every position.
                spec.targets = (inputs.input_ids_host[spec.index] + 1) % self.vocab_size
            out, counts = self._verified(spec, pending.read(), sampled, sample_slots)
            return LaunchedStep(self, step.step_id, step.req_ids[sample], sampled, sample_slots, positions, PendingSample.ready(out),
                                self.removals, prompt_out, (t0, t1, t2), lora_failed, counts, speculable)
        if len(sample_slots):
            self.batch.append_tokens(sample_slots, np.full(len(sample_slots), PLACEHOLDER, np.int32))
            for state in sampled:
                state.token_ids.append(PLACEHOLDER)
            if self.overlap:
                tokens = pending.tokens if pending.tokens is not None else torch.from_numpy(pending.read().token_ids).to(self.device)
                self._keep_on_device(sample_slots, tokens)
        return LaunchedStep(self, step.step_id, step.req_ids[sample], sampled, sample_slots, positions, pending, self.removals,
                            prompt_out, (t0, t1, t2), lora_failed, None, speculable, frames)

    def finish(self, launched: LaunchedStep) -> StepResult:
        """Waits for the launched step's tokens and puts them in their reserved places."""
        out = launched.pending.read()
        slots, positions = launched.slots, launched.positions
        if launched.token_counts is None:  # else a step with drafts: its tokens are in place already
            for state, position, token in zip(launched.sampled, positions.tolist(), out.token_ids.tolist()):
                state.token_ids[position] = token
            if launched.removals != self.removals:  # a request removed since has left its slot, maybe to another
                owned = np.fromiter((self.by_slot.get(s) is st for s, st in zip(slots.tolist(), launched.sampled)), bool, len(slots))
                slots, positions, tokens = slots[owned], positions[owned], out.token_ids[owned]
            else:
                tokens = out.token_ids
            self.batch.tokens[slots, positions] = tokens
        t0, t1, t2 = launched.times
        t3 = time.perf_counter()
        prompt_out = launched.prompt_out
        result = StepResult(
            step_id=launched.step_id,
            req_ids=launched.req_ids,
            token_ids=out.token_ids,
            logprobs=out.logprobs,
            top_counts=out.top_counts,
            top_ids=out.top_ids,
            top_logprobs=out.top_logprobs,
            timings=StepTimings((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3),
            prompt_counts=None if prompt_out is None else prompt_out.counts,
            prompt_logprobs=None if prompt_out is None else prompt_out.logprobs,
            prompt_ranks=None if prompt_out is None else prompt_out.ranks,
            prompt_top_ids=None if prompt_out is None else prompt_out.top_ids,
            prompt_top_logprobs=None if prompt_out is None else prompt_out.top_logprobs,
        )
        if launched.lora_failed is not None:
            result.lora_load_failed, result.lora_load_errors = launched.lora_failed
        if launched.token_counts is not None and (launched.token_counts != 1).any():
            result.token_counts = launched.token_counts.astype(np.int32)
        if launched.speculable is not None:
            result.draft_counts, result.draft_ids = self._propose(launched)
        if launched.frames is not None:
            result.frames = launched.frames.reshape(-1)
        return result

    # ------------------------------------------------------------ pooling

    def _pool(self, step: Step, inputs: StepInputs, slots, start, num_new, sample, t0: float) -> StepResult:
        """The forward pass of a pooling step; the rows that end their prompt answer with their vectors."""
        if len(step.mask_rows):
            raise ProtocolError("Step.mask_rows", "a pooling model samples no tokens")
        t1 = time.perf_counter()
        pooled = None
        if len(inputs.input_ids_host):
            model = self.model
            hidden = model.hidden_states(inputs.input_ids, inputs.positions, self.attention.prepare(inputs.attention), None)
            if self.pooler.config.pooling_type == "last":
                # Only the rows that end a prompt matter: one hidden row each.
                hidden = hidden.index_select(0, inputs.logits_indices)
                slots, start, num_new, sample = slots[sample], start[sample], np.ones(int(sample.sum()), np.int64), sample[sample]
            vectors = self.pooler.step(model.ops.rms_norm(hidden, model.norm), slots, start, num_new, sample)
            if len(vectors):
                pooled = vectors.reshape(-1)
        t2 = time.perf_counter()
        return pooled_result(step.step_id, step.req_ids[step.sample.astype(bool)], pooled, t0, t1, t2)

    # ------------------------------------------------------------ tokens on the device

    def _keep_on_device(self, slots: np.ndarray, tokens: torch.Tensor) -> None:
        """last_tokens[slot] = the token just sampled for it (read by a next step
        launched before this one finishes)."""
        capacity = self.batch.tokens.shape[0]
        if self.last_tokens is None or len(self.last_tokens) < capacity:
            grown = torch.zeros(capacity, dtype=torch.int64, device=tokens.device)
            if self.last_tokens is not None:
                grown[: len(self.last_tokens)] = self.last_tokens
            self.last_tokens = grown
        index = torch.from_numpy(slots).to(tokens.device, non_blocking=True)
        self.last_tokens.index_copy_(0, index, tokens.to(torch.int64))

    def _fill_from_device(self, inputs: StepInputs) -> None:
        """Input tokens not on the host yet (sampled by the unfinished previous
        step) come from last_tokens."""
        holes = np.flatnonzero(inputs.input_ids_host < 0)
        device = inputs.input_ids.device
        where = torch.from_numpy(holes).to(device, non_blocking=True)
        owners = torch.from_numpy(inputs.token_slots_host[holes].astype(np.int64)).to(device, non_blocking=True)
        inputs.input_ids.index_copy_(0, where, self.last_tokens.index_select(0, owners))

    # ------------------------------------------------------------ state updates

    def _remove(self, step: Step) -> None:
        # Unknown ids are ignored: removing twice is harmless.
        for req_id in step.removed.tolist():
            state = self.requests.pop(req_id, None)
            if state is not None:
                self.removals += 1
                del self.slot_of[req_id], self.by_slot[state.slot]
                self._slot_index = None
                self.prompt_slots.discard(state.slot)
                if self.proposer is not None:
                    self.proposer.release(state.slot)
                self.penalized.discard(req_id)
                self.embeds.pop(state.slot, None)
                self.mrope.pop(state.slot, None)
                self.cross_blocks.pop(state.slot, None)
                self.cross_pending.pop(state.slot, None)
                if self.frames is not None:
                    self.frames.remove(state.slot)
                if state.lora_id:
                    self._lora_user(state.lora_id, -1)
                    self.slot_lora[state.slot] = 0
                if self.pooler is not None:
                    self.pooler.drop(state.slot)
                self.batch.remove(state.slot)

    def _add(self, step: Step) -> None:
        for i, added in enumerate(step.added):
            where = f"Step.added[{i}]"
            if added.req_id in self.requests:
                raise ProtocolError(f"{where}.req_id", f"request {added.req_id} is already running")
            tokens = added.token_ids
            if not 0 <= added.num_prompt_tokens <= len(tokens):
                raise ProtocolError(
                    f"{where}.num_prompt_tokens", f"{added.num_prompt_tokens} is outside [0, {len(tokens)}]"
                )
            bad = np.flatnonzero((tokens < 0) | (tokens >= self.vocab_size))
            if bad.size:
                j = int(bad[0])
                raise ProtocolError(f"{where}.token_ids[{j}]", f"{int(tokens[j])} is outside the vocabulary [0, {self.vocab_size})")
            replaced = self._added_embeds(where, added) if added.embeds >= 0 and self.frames is None else None
            prompt_frames = self._added_frames(where, added) if self.frames is not None else None
            rope = self._added_positions(where, added) if added.positions >= 0 else None
            cross = self._added_cross(where, added) if added.encoder_states >= 0 or self.cross is not None else None
            if added.lora_id != 0:
                self._check_lora_id(where, added.lora_id)
            slot = self.batch.add(tokens)
            if cross is not None:
                self.cross_blocks[slot] = (cross[1], cross[0].shape[0])
                self.cross_pending[slot] = cross[0]
            if replaced is not None:
                self.embeds[slot] = replaced
            if prompt_frames is not None:
                self.frames.add(slot, added.req_id, prompt_frames, added.num_prompt_tokens, len(tokens))
            if rope is not None:
                self.mrope[slot] = rope
            state = RequestState(
                req_id=added.req_id,
                token_ids=tokens.tolist(),
                num_prompt_tokens=added.num_prompt_tokens,
                sampling=added.sampling,
                slot=slot,
                prompt_logprobs=added.prompt_logprobs,
                lora_id=added.lora_id,
            )
            if added.lora_id != 0:
                self._lora_user(added.lora_id, 1)
                self._slot_lora_column()[slot] = added.lora_id
            self.requests[added.req_id] = state
            self.slot_of[added.req_id] = slot
            self._slot_index = None
            self.by_slot[slot] = state
            if added.prompt_logprobs >= 0 and added.num_prompt_tokens > 1:
                self.prompt_slots.add(slot)
            if penalizes(added.sampling):
                self.penalized.add(added.req_id)

    # ------------------------------------------------------------ LoRA

    def _lora_off(self, where: str) -> ProtocolError:
        return ProtocolError(where, "this worker serves no LoRA adapters (--max-loras 0)")

    def _lora_loads(self, step: Step) -> tuple[np.ndarray, list[str]]:
        """Step.lora's loads; the failed loads' ids and lines."""
        if self.lora is None:
            raise self._lora_off("Step.lora")
        failed, errors = [], []
        for i, load in enumerate(step.lora.loads):
            where = f"Step.lora.loads[{i}].lora_id"
            if load.lora_id < 1:
                raise ProtocolError(where, f"{load.lora_id} is not an adapter id (ids start at 1; 0 is the base model)")
            if load.lora_id in self.lora.adapters:
                raise ProtocolError(where, f"adapter {load.lora_id} is already loaded")
            error = self.lora.load(load.lora_id, load.name, load.path)
            if error is not None:
                failed.append(load.lora_id)
                errors.append(error)
        return np.asarray(failed, np.int32), errors

    def _lora_unloads(self, step: Step) -> None:
        for i, lora_id in enumerate(step.lora.unloads.tolist()):
            users = self.lora_users.get(lora_id, 0)
            if users:
                raise ProtocolError(f"Step.lora.unloads[{i}]", f"adapter {lora_id} is used by {users} live request(s)")
            self.lora.unload(lora_id)  # an id not loaded (a failed load) is ignored: unloading twice is harmless

    def _check_lora_id(self, where: str, lora_id: int) -> None:
        if self.lora is None:
            raise self._lora_off(f"{where}.lora_id")
        if lora_id not in self.lora.adapters:
            raise ProtocolError(f"{where}.lora_id", f"adapter {lora_id} is not loaded")

    def _lora_user(self, lora_id: int, change: int) -> None:
        users = self.lora_users.get(lora_id, 0) + change
        if users:
            self.lora_users[lora_id] = users
        else:
            del self.lora_users[lora_id]

    def _slot_lora_column(self) -> np.ndarray:
        """slot_lora, grown to the persistent batch's slots (a column like the batch's own)."""
        capacity = self.batch.tokens.shape[0]
        if len(self.slot_lora) < capacity:
            self.slot_lora = np.concatenate((self.slot_lora, np.zeros(capacity - len(self.slot_lora), np.int32)))
        return self.slot_lora

    def _lora_batch(self, slots: np.ndarray, inputs: StepInputs) -> LoraBatch | None:
        """The step's LoraBatch (None: no row uses an adapter), after checking --max-loras."""
        row_lora = self._slot_lora_column()[slots]
        used = np.unique(row_lora[row_lora != 0])
        if not len(used):
            return None
        if len(used) > self.lora.max_loras:
            raise ProtocolError(
                "Step.req_ids", f"rows use {len(used)} adapters ({', '.join(map(str, used.tolist()))}), more than --max-loras {self.lora.max_loras}"
            )
        if self.model is None:
            return None  # dummy-null: no forward pass to apply them to
        return self.lora.batch(self.slot_lora[inputs.token_slots_host])

    def _rows(self, step: Step, drafts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Validates the per-row arrays, appends each row's new blocks and
        returns the rows as int64 columns (slot, start, num_new) and a bool
        sample mask. A failing row is re-examined by _row_error for a message
        naming the field. drafts: each row's draft count (Step.spec), known
        tokens as far as its rows go."""
        n = len(step.req_ids)
        for name in _ROW_FIELDS:
            if len(getattr(step, name)) != n:
                raise ProtocolError(f"Step.{name}", f"has {len(getattr(step, name))} entries, req_ids has {n}")
        if n == 0:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty, np.zeros(0, bool)
        counts = step.new_block_counts.astype(np.int64)
        if counts.min() < 0:
            i = int(np.flatnonzero(counts < 0)[0])
            raise ProtocolError(f"Step.new_block_counts[{i}]", f"negative count {int(counts[i])}")
        total_blocks = int(counts.sum())
        if total_blocks != len(step.new_block_ids):
            raise ProtocolError("Step.new_block_ids", f"has {len(step.new_block_ids)} ids, new_block_counts sum to {total_blocks}")
        if total_blocks and (step.new_block_ids.min() < 0 or step.new_block_ids.max() >= self.num_blocks):
            raise ProtocolError("Step.new_block_ids", f"block id outside [0, {self.num_blocks})")
        slots = self._slots_of(step.req_ids)
        if slots.min() < 0:
            i = int(np.flatnonzero(slots < 0)[0])
            raise ProtocolError(f"Step.req_ids[{i}]", f"unknown request {int(step.req_ids[i])}")
        self.batch.append_blocks(slots, counts, step.new_block_ids)
        start = step.num_computed.astype(np.int64)
        num_new = step.num_new_tokens.astype(np.int64)
        sample = step.sample.astype(bool)
        end = start + num_new
        known = self.batch.lengths[slots] if drafts is None else self.batch.lengths[slots] + drafts
        bad = (
            (start < 0) | (num_new < 0) | (end > known) | (end > self.batch.num_pages[slots] * self.block_size)
            | (sample & ((num_new == 0) | (end != known)))
        )
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise self._row_error(i, int(start[i]), int(num_new[i]), int(slots[i]), 0 if drafts is None else int(drafts[i]))
        return slots, start, num_new, sample

    def _slots_of(self, req_ids: np.ndarray) -> np.ndarray:
        """The slot of each request id, -1 for an unknown one."""
        if self._slot_index is None:
            ids = np.fromiter(self.slot_of.keys(), np.int64, len(self.slot_of))
            slots = np.fromiter(self.slot_of.values(), np.int64, len(self.slot_of))
            order = np.argsort(ids)
            self._slot_index = (ids[order], slots[order])
        ids, slots = self._slot_index
        if not len(ids):
            return np.full(len(req_ids), -1, np.int64)
        at = np.minimum(np.searchsorted(ids, req_ids), len(ids) - 1)
        return np.where(ids[at] == req_ids, slots[at], -1)

    def _row_error(self, i: int, start: int, count: int, slot: int, drafts: int = 0) -> ProtocolError:
        end = start + count
        req_id = self.by_slot[slot].req_id
        known = int(self.batch.lengths[slot]) + drafts
        pages = int(self.batch.num_pages[slot])
        if start < 0 or count < 0:
            return ProtocolError(f"Step.num_computed[{i}]", f"negative position or count ({start}, {count})")
        if end > known:
            return ProtocolError(f"Step.num_new_tokens[{i}]", f"row runs to position {end} but request {req_id} has {known} tokens")
        if end > pages * self.block_size:
            return ProtocolError(
                f"Step.new_block_counts[{i}]",
                f"request {req_id} needs {-(-end // self.block_size)} blocks for {end} tokens, has {pages}",
            )
        return ProtocolError(f"Step.sample[{i}]", f"row ends at position {end} but request {req_id} has {known} tokens")

    # ------------------------------------------------------------ speculative decoding

    def _drafts(self, step: Step) -> np.ndarray | None:
        """Step.spec's draft count per row (int64), checked; None when no row has drafts."""
        if self.proposer is None:
            raise ProtocolError("Step.spec", "this worker does no speculative decoding (--num-speculative-tokens 0)")
        spec, n, k = step.spec, len(step.req_ids), self.proposer.k
        counts = spec.draft_counts.astype(np.int64)
        if len(counts) != n:
            raise ProtocolError("Step.spec.draft_counts", f"has {len(counts)} entries, req_ids has {n}")
        if n and (counts.min() < 0 or counts.max() > k):
            i = int(np.flatnonzero((counts < 0) | (counts > k))[0])
            raise ProtocolError(f"Step.spec.draft_counts[{i}]", f"{int(counts[i])} drafts is outside [0, --num-speculative-tokens {k}]")
        if int(counts.sum()) != len(spec.draft_ids):
            raise ProtocolError("Step.spec.draft_ids", f"has {len(spec.draft_ids)} ids, draft_counts sum to {int(counts.sum())}")
        ids = spec.draft_ids
        if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ProtocolError("Step.spec.draft_ids", f"a draft is outside the vocabulary [0, {self.vocab_size})")
        return counts if len(ids) else None

    def _spec_rows(self, step: Step, drafts: np.ndarray, num_new: np.ndarray, sample: np.ndarray, inputs: StepInputs,
                   sampled: list[RequestState]) -> SpecRows:
        """The draft rows among the sampled rows and the positions whose logits verify them (after _rows' checks)."""
        rows = np.flatnonzero(drafts)
        bad = ~sample[rows] | (num_new[rows] <= drafts[rows])
        if bad.any():
            i = int(rows[np.flatnonzero(bad)[0]])
            why = "a row with drafts samples (sample = 1)" if not sample[i] else f"its {int(num_new[i])} new tokens leave no known token before {int(drafts[i])} drafts"
            raise ProtocolError(f"Step.spec.draft_counts[{i}]", why)
        drafted = (np.cumsum(sample) - 1)[rows]
        unverifiable = [j for j, i in enumerate(drafted.tolist()) if not self._verifiable(sampled[i])]
        if unverifiable:
            i = int(rows[unverifiable[0]])
            raise ProtocolError(f"Step.spec.draft_counts[{i}]", f"request {int(step.req_ids[i])} asks for penalties, "
                                "logit biases or min_tokens: its drafts cannot be verified")
        if len(step.mask_rows) and np.isin(step.mask_rows, drafted).any():
            raise ProtocolError("Step.mask_rows", "a grammar-masked row carries drafts (Step.spec): its drafts cannot be verified")
        counts = drafts[rows]
        last = inputs.logits_indices_host[drafted]  # each draft row's last flattened token: its last draft
        width = counts + 1
        local = np.arange(int(width.sum())) - np.repeat(np.cumsum(width) - width, width)
        index = np.repeat(last - counts, width) + local
        rest = np.setdiff1d(np.arange(int(sample.sum())), drafted)
        return SpecRows(drafted, rest, counts, step.spec.draft_ids.astype(np.int64), index)

    def _targets(self, logits: torch.Tensor, spec: SpecRows, sampled: list[RequestState]) -> np.ndarray:
        """The token each verify position of the draft rows samples (spec.index's logits, row after row).

        Greedy rows take the argmax. A sampled row draws each position as it would without drafts:
        the sampler with the row's parameters and that position's output index (a seeded row's
        uniform number is its seed's at that index). Since both proposers are deterministic (a
        proposal puts all its mass on one token), accepting a draft while it equals the token
        drawn is rejection sampling exactly: a draft x is kept with probability p(x), and on
        rejection the token drawn is distributed as p without x, renormalized. So the output is
        the target's distribution, and a seeded row's tokens are the ones it gets without
        speculation."""
        rows = [sampled[i] for i in spec.drafted.tolist()]
        if all(is_greedy(st) and st.sampling.logprobs < 0 for st in rows):
            return first_argmax(logits).cpu().numpy().astype(np.int64)
        positions = [_VerifyPosition(st.sampling, st.num_output_tokens + j) for st, d in zip(rows, spec.counts.tolist()) for j in range(d + 1)]
        spec.drawn = self.sampler.sample(logits, positions)
        return spec.drawn.token_ids.astype(np.int64)

    def _verify_graphed(self, spec: SpecRows, drafts: np.ndarray, num_new: np.ndarray, inputs: StepInputs,
                        head_inputs: StepInputs, head_sampled: bool, sampled: list[RequestState]) -> bool:
        """A verify step whose rows are each one known token and its drafts, through the decode
        graphs (every token a row): sets spec.targets and, for the other sampled rows, spec.head_logits.
        False when the step does not qualify (a prefill chunk, too many tokens): it runs eagerly."""
        if not (num_new == drafts + 1).all():
            return False
        every = self.graphs.verify(inputs)
        if every is None:
            return False
        index = torch.from_numpy(spec.index).to(every.device, non_blocking=True)
        spec.targets = self._targets(every.index_select(0, index), spec, sampled)
        if head_sampled:
            spec.head_logits = every.index_select(0, head_inputs.logits_indices)
        return True

    def _verified(self, spec: SpecRows, out: SampleOutput, sampled: list[RequestState], slots: np.ndarray) -> tuple[SampleOutput, np.ndarray]:
        """Verification of the draft rows (spec.targets: the token each position drew), merged with the
        other rows' sampled tokens; every appended token put in place (state, persistent batch) at once.
        Returns the step's output (tokens row after row, their logprobs token by token) and the count per
        sampled row."""
        d, targets = spec.counts, spec.targets
        t_start = np.cumsum(d + 1) - (d + 1)
        d_start = np.cumsum(d) - d
        local = np.arange(len(spec.draft_ids)) - np.repeat(d_start, d)
        rejected = spec.draft_ids != targets[np.repeat(t_start, d) + local]
        # Accepted drafts per row: the index of its first rejected draft (d when none is rejected).
        accepted = np.minimum.reduceat(np.where(rejected, local, np.repeat(d, d)), d_start)
        counts = np.ones(len(sampled), np.int64)
        counts[spec.drafted] = accepted + 1
        ends = np.cumsum(counts)
        begin = ends - counts
        tokens = np.empty(int(ends[-1]) if len(ends) else 0, np.int32)
        tokens[begin[spec.rest]] = out.token_ids
        # A row appends its accepted drafts and the token after them: the first accepted + 1 targets.
        kept = accepted + 1
        owner = np.repeat(np.arange(len(d)), kept)
        at = np.arange(int(kept.sum())) - np.repeat(np.cumsum(kept) - kept, kept)
        tokens[begin[spec.drafted][owner] + at] = targets[t_start[owner] + at]
        self.batch.append_runs(slots, counts, tokens)
        for state, a, b in zip(sampled, begin.tolist(), ends.tolist()):
            state.token_ids.extend(tokens[a:b].tolist())
        if self.overlap and len(slots):
            self._keep_on_device(slots, torch.from_numpy(tokens[ends - 1]).to(self.device))
        # Logprobs token by token: a draft row's kept positions' from its verify draws, the others' their own.
        drawn = spec.drawn
        rest_at, kept_at, kept_from = begin[spec.rest], begin[spec.drafted][owner] + at, t_start[owner] + at
        logprobs = top_counts = top_ids = top_logprobs = None
        if out.logprobs is not None or (drawn is not None and drawn.logprobs is not None):
            logprobs = np.zeros(len(tokens), np.float32)
            if out.logprobs is not None:
                logprobs[rest_at] = out.logprobs
            if drawn is not None and drawn.logprobs is not None:
                logprobs[kept_at] = drawn.logprobs[kept_from]
        if out.top_counts is not None or (drawn is not None and drawn.top_counts is not None):
            top_counts = np.zeros(len(tokens), np.int32)
            pieces: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros(0, np.int32), np.zeros(0, np.float32))] * len(tokens)
            for source, where, which in ((out, rest_at, np.arange(len(rest_at))), (drawn, kept_at, kept_from)):
                if source is None or source.top_counts is None:
                    continue
                first = np.cumsum(source.top_counts) - source.top_counts
                for token_at, j in zip(where.tolist(), which.tolist()):
                    c, f = int(source.top_counts[j]), int(first[j])
                    top_counts[token_at] = c
                    pieces[token_at] = (source.top_ids[f : f + c], source.top_logprobs[f : f + c])
            top_ids = np.concatenate([p[0] for p in pieces]).astype(np.int32)
            top_logprobs = np.concatenate([p[1] for p in pieces]).astype(np.float32)
        return SampleOutput(tokens, logprobs, top_counts, top_ids, top_logprobs), counts

    def _speculable(self, sampled: list[RequestState], mask_rows: np.ndarray) -> np.ndarray:
        """Which sampled rows get draft proposals: those _verifiable, without a grammar mask."""
        ok = np.fromiter((self._verifiable(st) for st in sampled), bool, len(sampled))
        ok[mask_rows[(mask_rows >= 0) & (mask_rows < len(ok))]] = False
        return ok

    def _verifiable(self, state: RequestState) -> bool:
        """Rows whose drafts verification can decide from each position's logits alone: greedy or sampled
        (temperature, top-k, top-p, min-p, seed; logprobs too), with no penalties, logit edits or min_tokens."""
        s = state.sampling
        return (not penalizes(s) and s.min_tokens == 0 and not len(s.suppress_token_ids)
                and not len(s.allowed_token_ids) and not len(s.logit_bias_ids) and state.slot not in self.prompt_slots)

    def _propose(self, launched: LaunchedStep) -> tuple[np.ndarray | None, np.ndarray | None]:
        """StepResult.draft_counts / draft_ids: the proposer's drafts for each speculable row, from its whole token list."""
        counts = np.zeros(len(launched.slots), np.int32)
        rows = [i for i in np.flatnonzero(launched.speculable).tolist()
                if self.by_slot.get(int(launched.slots[i])) is launched.sampled[i]]  # not removed since the launch
        slots = [int(launched.slots[i]) for i in rows]
        drafts = self.proposer.propose_rows(slots, [self.batch.tokens[s, : self.batch.lengths[s]] for s in slots])
        for i, ids in zip(rows, drafts):
            counts[i] = len(ids)
        if not counts.any():
            return None, None
        return counts, np.concatenate(drafts).astype(np.int32)

    # ------------------------------------------------------------ prompt embeddings

    def _added_embeds(self, where: str, added) -> tuple[np.ndarray, torch.Tensor]:
        """The positions of the prompt's embeds tokens and the rows that replace them."""
        if self.embeds_of is None or not len(self.embeds_token_ids):
            raise ProtocolError(f"{where}.embeds", "this worker's model takes no prompt embeddings")
        try:
            rows = self.embeds_of(added.embeds)
        except KeyError:
            raise ProtocolError(f"{where}.embeds", f"tensor handle {added.embeds} is not in this worker's store") from None
        positions = np.flatnonzero(np.isin(added.token_ids[: added.num_prompt_tokens], self.embeds_token_ids)).astype(np.int64)
        width = self.model.config.hidden_size * (1 + self.deepstack_layers)
        if rows.dim() != 2 or rows.shape[0] != len(positions) or rows.shape[1] != width:
            raise ProtocolError(
                f"{where}.embeds",
                f"tensor of shape {tuple(rows.shape)} for {len(positions)} positions of tokens {self.embeds_token_ids.tolist()} "
                f"(rows of {width})",
            )
        return positions, rows

    def _added_frames(self, where: str, added) -> torch.Tensor:
        """A frame model's request: its prompt frames (AddedRequest.embeds), checked."""
        if added.embeds < 0 or self.embeds_of is None:
            raise ProtocolError(f"{where}.embeds", "this worker's model takes its prompt as frames; none were given")
        try:
            frames = self.embeds_of(added.embeds)
        except KeyError:
            raise ProtocolError(f"{where}.embeds", f"tensor handle {added.embeds} is not in this worker's store") from None
        wrong = self.frames.check(frames, added.req_id, added.num_prompt_tokens, len(added.token_ids))
        if wrong is not None:
            raise ProtocolError(f"{where}.embeds", wrong)
        return frames

    def _added_positions(self, where: str, added) -> tuple[np.ndarray, int]:
        """A multimodal-rotary prompt's positions [3, num_prompt_tokens] and its later tokens' offset."""
        rotary = getattr(self.model, "rotary", None)
        if self.embeds_of is None or rotary is None or rotary.mrope_section is None:
            raise ProtocolError(f"{where}.positions", "this worker's model takes no multimodal rotary positions")
        try:
            positions = self.embeds_of(added.positions)
        except KeyError:
            raise ProtocolError(f"{where}.positions", f"tensor handle {added.positions} is not in this worker's store") from None
        n = added.num_prompt_tokens
        if positions.dim() != 2 or tuple(positions.shape) != (3, n) or positions.dtype != torch.int64:
            raise ProtocolError(f"{where}.positions", f"an int64 tensor [3, {n}] was expected, got {positions.dtype} {tuple(positions.shape)}")
        host = positions.cpu().numpy()
        return host, int(host.max(initial=-1)) + 1 - n

    def _added_cross(self, where: str, added) -> tuple[torch.Tensor, np.ndarray]:
        """An encoder-decoder request's encoder states [L, hidden] and its cross blocks (checked)."""
        if self.cross is None or self.embeds_of is None:
            raise ProtocolError(f"{where}.encoder_states", "this worker's model has no cross attention")
        if added.encoder_states < 0:
            raise ProtocolError(f"{where}.encoder_states", "this worker's model cross-attends an encoder output; none was given")
        try:
            states = self.embeds_of(added.encoder_states)
        except KeyError:
            raise ProtocolError(f"{where}.encoder_states", f"tensor handle {added.encoder_states} is not in this worker's store") from None
        hidden = self.model.config.hidden_size if self.model is not None else None
        if states.dim() != 2 or states.shape[0] == 0 or (hidden is not None and states.shape[1] != hidden):
            raise ProtocolError(f"{where}.encoder_states", f"a tensor [positions, {hidden}] was expected, got {tuple(states.shape)}")
        blocks = np.asarray(added.cross_block_ids, np.int64)
        need = -(-states.shape[0] // self.block_size)
        if len(blocks) != need:
            raise ProtocolError(f"{where}.cross_block_ids", f"{len(blocks)} blocks for {states.shape[0]} positions (blocks of {self.block_size}: {need})")
        bad = np.flatnonzero((blocks < 0) | (blocks >= self.num_blocks))
        if bad.size:
            raise ProtocolError(f"{where}.cross_block_ids[{int(bad[0])}]", f"block {int(blocks[bad[0]])} is outside [0, {self.num_blocks})")
        return states, blocks

    def _write_cross(self) -> None:
        """The cross-attention K/V of the requests added since the last forward, every layer in one projection."""
        slots = list(self.cross_pending)
        states = [self.cross_pending[s] for s in slots]
        cache_slots = [self.cross.slots(*self.cross_blocks[s]) for s in slots]
        self.cross_pending.clear()
        if self.model is not None:
            self.model.write_cross(self.cross, states, cache_slots)

    def _cross_plan(self, slots: np.ndarray, inputs: StepInputs):
        tables = [self.cross_blocks[int(s)] for s in slots.tolist()]
        lengths = np.fromiter((n for _, n in tables), np.int64, len(tables))
        return self.cross.prepare([blocks for blocks, _ in tables], lengths, inputs.attention.query_start)

    def _rotary_positions(self, inputs: StepInputs) -> tuple[StepInputs, bool]:
        """The step's inputs with each multimodal-rotary token's positions: a prompt token's own (t, h, w),
        a later token's index plus its request's offset. True when some token needs all three streams
        (a prompt chunk holding an image): then positions are [3, T] and the step runs eagerly."""
        owner = inputs.token_slots_host
        if not np.isin(owner, np.fromiter(self.mrope, np.int64, len(self.mrope))).any():
            return inputs, False
        flat = inputs.positions_host.copy()
        prompt_tokens = []  # (token indices, their prompt positions [3, n]) of prompt tokens in the step
        for slot in np.unique(owner).tolist():
            rope = self.mrope.get(slot)
            if rope is None:
                continue
            prompt, offset = rope
            at = np.flatnonzero(owner == slot)
            p = flat[at]
            inside = p < prompt.shape[1]
            if inside.any():
                prompt_tokens.append((at[inside], prompt[:, p[inside]]))
            flat[at[~inside]] = p[~inside] + offset
        device = inputs.positions.device
        if prompt_tokens:
            streams = np.broadcast_to(flat, (3, len(flat))).copy()
            for at, positions in prompt_tokens:
                streams[:, at] = positions
            return dataclasses.replace(inputs, positions=torch.from_numpy(streams).to(device)), True
        return dataclasses.replace(inputs, positions=torch.from_numpy(flat).to(device)), False

    def _replaced_rows(self, slots: np.ndarray, start: np.ndarray, num_new: np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(indices into the step's flattened tokens, rows) for the replaced
        positions this step computes (a chunk of a prompt may hold part of an image)."""
        query_start = np.concatenate(([0], np.cumsum(num_new)))
        index, parts = [], []
        for i in np.flatnonzero(np.isin(slots, np.fromiter(self.embeds, np.int64, len(self.embeds)))).tolist():
            positions, rows = self.embeds[int(slots[i])]
            lo, hi = np.searchsorted(positions, [start[i], start[i] + num_new[i]])
            if hi > lo:
                index.append(positions[lo:hi] - start[i] + query_start[i])
                parts.append(rows[lo:hi])
        if not index:
            return None
        return torch.as_tensor(np.concatenate(index), device=self.device), torch.cat(parts)

    # ------------------------------------------------------------ prompt logprobs

    def _prompt_rows(self, slots: np.ndarray, start: np.ndarray, num_new: np.ndarray) -> PromptRows | None:
        """The step's prompt positions that want logprobs; None when there are none.
        A request leaves prompt_slots once a step reaches its last prompt position."""
        wanted = np.flatnonzero(np.isin(slots, np.fromiter(self.prompt_slots, np.int64, len(self.prompt_slots))))
        if not len(wanted):
            return None
        counts = np.zeros(len(slots), np.int32)
        query_start = np.concatenate(([0], np.cumsum(num_new)))
        index, targets, ks = [], [], []
        for i in wanted.tolist():
            slot = int(slots[i])
            state = self.by_slot[slot]
            last = state.num_prompt_tokens - 1  # positions before it score a prompt token
            lo, hi = int(start[i]), min(int(start[i] + num_new[i]), last)
            if int(start[i] + num_new[i]) >= last:
                self.prompt_slots.discard(slot)
            if hi <= lo:
                continue
            counts[i] = hi - lo
            index.append(np.arange(lo, hi) - lo + query_start[i])
            targets.append(self.batch.tokens[slot, lo + 1 : hi + 1].astype(np.int64))
            ks.append(np.full(hi - lo, min(state.prompt_logprobs, self.vocab_size), np.int64))
        if not index:
            return None
        return PromptRows(counts, np.concatenate(index), np.concatenate(targets), np.concatenate(ks))

    def _prompt_logprobs(self, hidden: torch.Tensor, rows: PromptRows) -> PromptLogprobs:
        """Log-softmax at each prompt position, in slices of positions; one copy to the host per slice."""
        total = len(rows.targets)
        width = int(rows.ks.max())
        step = max(1, _PROMPT_SLICE_FLOATS // self.vocab_size)
        index = torch.as_tensor(rows.token_index, device=hidden.device)
        targets = torch.as_tensor(rows.targets, device=hidden.device)
        logprobs = np.empty(total, np.float32)
        ranks = np.empty(total, np.int32)
        top_ids = np.empty((total, width), np.int32)
        top_lps = np.empty((total, width), np.float32)
        for a in range(0, total, step):
            b = min(a + step, total)
            logits = self.model.logits(hidden, index[a:b])
            if logits is None:
                continue  # a tensor-parallel rank other than 0: it only lends its vocabulary slice
            lp = torch.log_softmax(logits, dim=-1)
            chosen = lp.gather(1, targets[a:b, None])
            parts = [chosen[:, 0].view(torch.int32), ((lp > chosen).sum(dim=-1) + 1).to(torch.int32)]
            if width:
                values, ids = torch.topk(lp, width)
                parts += [ids.to(torch.int32).reshape(-1), values.reshape(-1).view(torch.int32)]
            host = torch.cat(parts).cpu().numpy()
            n = b - a
            logprobs[a:b] = host[:n].view(np.float32)
            ranks[a:b] = host[n : 2 * n]
            if width:
                top_ids[a:b] = host[2 * n : 2 * n + n * width].reshape(n, width)
                top_lps[a:b] = host[2 * n + n * width :].view(np.float32).reshape(n, width)
        keep = (np.arange(width)[None, :] < rows.ks[:, None]).reshape(-1)
        return PromptLogprobs(rows.counts, logprobs, ranks, top_ids.reshape(-1)[keep], top_lps.reshape(-1)[keep])

    # ------------------------------------------------------------ sampling

    def _token_mask(self, step: Step, num_sampled: int, wait_mask: Callable[[int], StepMask] | None) -> TokenMask | None:
        rows = step.mask_rows
        if len(rows) == 0:
            return None
        if rows.min() < 0 or rows.max() >= num_sampled or np.any(np.diff(rows) <= 0):
            raise ProtocolError("Step.mask_rows", f"must be increasing indices among the {num_sampled} sampled rows")
        if wait_mask is None:
            raise ProtocolError("Step.mask_rows", "this worker cannot receive step masks")
        mask = wait_mask(step.step_id)
        words = words_per_row(self.vocab_size)
        if len(mask.bitmask) != len(rows) * words:
            raise ProtocolError("StepMask.bitmask", f"has {len(mask.bitmask)} words, {len(rows)} masked rows need {len(rows) * words}")
        return TokenMask(rows.astype(np.int64), mask.bitmask)

    def _screened(self, sampled: list[RequestState], mask_rows: np.ndarray) -> np.ndarray | None:
        """The sampled rows the head's screen can decide (head_screen.py), or None
        when there is no screen or no such row."""
        screen = self.model.lm_head.screen if self.model is not None and self.model.tp is None else None
        if screen is None or not sampled:
            return None
        ok = np.array([screens(st, self.vocab_size) for st in sampled], dtype=bool)
        ok[mask_rows[(mask_rows >= 0) & (mask_rows < len(ok))]] = False  # grammar-masked rows need their whole row
        return np.flatnonzero(ok) if ok.any() else None

    def _sample_screened(self, rows: torch.Tensor, screened: np.ndarray, shares: int, sampled: list[RequestState],
                         token_mask: TokenMask | None) -> SampleOutput:
        """Tokens of the screened rows from the screen (shared out to `shares`
        threads); the rest of the rows (and the screened ones it leaves
        undecided) get float32 logits and the sampler."""
        model = self.model
        assert model is not None and model.lm_head.screen is not None
        tokens = np.full(len(sampled), -1, dtype=np.int64)
        temperatures = [0.0 if is_greedy(sampled[i]) else sampled[i].sampling.temperature for i in screened]
        tokens[screened] = model.lm_head.screen.sample(rows[torch.from_numpy(screened)], temperatures, self.sampler.generator, shares)
        rest = np.flatnonzero(tokens < 0)
        if len(rest) == 0:
            return SampleOutput(tokens.astype(np.int32), None, None, None, None)
        mask = None
        if token_mask is not None:  # masked rows are never screened, so all of them are in rest
            mask = TokenMask(np.searchsorted(rest, token_mask.rows), token_mask.bitmask)
        if self.cpu is not None:
            self.cpu.for_head()
        logits = model.lm_head(rows[torch.from_numpy(rest)] if len(rest) < len(sampled) else rows)
        out = self.sampler.sample(logits, [sampled[i] for i in rest], mask)
        tokens[rest] = out.token_ids
        # Screened rows asked for no logprobs: zeros in their places (rest is increasing,
        # so the top logprobs stay in row order).
        logprobs = None
        if out.logprobs is not None:
            logprobs = np.zeros(len(sampled), np.float32)
            logprobs[rest] = out.logprobs
        top_counts = None
        if out.top_counts is not None:
            top_counts = np.zeros(len(sampled), np.int32)
            top_counts[rest] = out.top_counts
        return SampleOutput(tokens.astype(np.int32), logprobs, top_counts, out.top_ids, out.top_logprobs)

    def _sample(
        self, logits: torch.Tensor | None, sampled: list[RequestState], inputs: StepInputs, token_mask: TokenMask | None = None
    ) -> PendingSample:
        if logits is None and self.model is not None:
            # An empty step: nothing ran, nothing to sample.
            return PendingSample.ready(SampleOutput(np.zeros(0, np.int32), None, None, None, None))
        if logits is None:
            # dummy-null: a cheap deterministic token, (last input token + 1) % vocab.
            last = inputs.input_ids_host[inputs.logits_indices_host]
            tokens = ((last + 1) % self.vocab_size).astype(np.int32)
            wants = any(s.sampling.logprobs >= 0 for s in sampled)
            return PendingSample.ready(SampleOutput(tokens, np.zeros(len(sampled), np.float32) if wants else None, None, None, None))
        return self.sampler.launch(logits, sampled, token_mask)
