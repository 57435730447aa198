"""CSM in the worker's StepRunner: the backbone as the kv_cache node's decoder,
frames as its inputs, and the depth decoder run after every step's codebook-0
draw, for all the step's sampled rows at once.

What the engine sees. A CSM request is a token request whose token at each
generated position is that frame's codebook 0, or the node's stop id
(<|audio_eos|>) for the stop frame; the whole frame goes back beside it
(StepResult.frames), so the engine schedules, counts max tokens and stops on
one id per position as for any decoder, and the conductor streams frames.

What the worker keeps (CsmFrames), because a position's input is a frame of
K + 1 ids, not the token the engine knows:
- per slot, the request's prompt frames [P, K+1] (AddedRequest.embeds: a
  tensor in the graph worker's store, made by process_prompt);
- per request, the frames it generated, kept across preemption (a re-added
  request recomputes its outputs from them) until the graph request ends
  (GraphWork.finished_requests -> release()).
A step's input rows are those frames' embeddings, put in place of every
position's token embedding through the decoder's `replace` path.

Sampling. Codebook 0 goes through the worker's Sampler like any token (its
temperature, top-k and seed). The other codebooks use the row's temperature
and top-k too, as transformers' generate does with csm-1b's defaults (the same
at both levels): argmax at temperature 0, otherwise a draw from a generator per
request (seeded from the request's seed when it has one).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...model.config import ModelConfig, read_json
from .model import CsmBackbone, CsmDepthDecoder, audio_frames, csm_backbone_config, frame_stops, read_codebook_tables

_SEED_STRIDE = 1_000_003  # keeps the depth generators of different seeds apart


def read_config(model_dir: Path) -> ModelConfig:
    """The backbone's shape (it sizes the KV cache) with the TEXT vocabulary: the engine's prompt ids are
    text ids; sampled ids (codebook 0, < its vocabulary) and the stop id lie inside it."""
    raw = read_json(Path(model_dir) / "config.json")
    config = csm_backbone_config(raw)
    return dataclasses.replace(config, vocab_size=int(raw.get("text_vocab_size", 128256)))


class CsmStepModel:
    """The kv_cache node's model for the StepRunner: DecoderModel's step interface (hidden_states over the
    paged cache, head_input) over the backbone, plus codebook-0 logits and the depth decoder."""

    def __init__(self, config: ModelConfig, reader: Any, raw: dict[str, Any]):
        backbone_table, depth_table = read_codebook_tables(reader)
        self.backbone = CsmBackbone(reader, raw, table=backbone_table)
        self.depth = CsmDepthDecoder(reader, raw, table=depth_table)
        self.config = config
        self.scale = self.backbone.scale
        self.tp = None
        self.num_codebooks = self.backbone.num_codebooks
        self.eos = self.backbone.eos

    def weight_bytes(self) -> int:
        return self.backbone.weight_bytes() + self.depth.weight_bytes()

    def hidden_states(self, input_ids, positions, attention, replace=None, lora=None) -> torch.Tensor:
        return self.backbone.decoder.hidden_states(input_ids, positions, attention, replace=replace)

    def head_input(self, hidden: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return self.backbone.head_input(hidden, indices)

    def codebook0_logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.backbone.codebook0_logits(h)

    def logits(self, hidden: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return self.codebook0_logits(self.head_input(hidden, indices))


def make_step_model(model_dir: Path):
    """KvDecoderLayout.make_decoder for a CSM directory."""
    raw = read_json(Path(model_dir) / "config.json")
    return lambda config, reader: CsmStepModel(config, reader, raw)


class CsmFrames:
    """The StepRunner's frame inputs and depth decoding (see the module docstring)."""

    def __init__(self, model: CsmStepModel, stop_token_id: int):
        self.model = model
        self.width = model.num_codebooks
        self.stop_token_id = stop_token_id
        self.prompts: dict[int, tuple[int, torch.Tensor]] = {}  # slot -> (req_id, prompt frames [P, K+1])
        self.generated: dict[int, list[np.ndarray]] = {}  # req_id -> its frames so far, each [K]
        self.generators: dict[int, torch.Generator] = {}  # req_id -> its depth draws' generator
        self.ended: set[int] = set()  # requests released while still in a slot (dropped at their removal)

    def check(self, prompt: torch.Tensor, req_id: int, num_prompt_tokens: int, num_tokens: int) -> str | None:
        """None, or what is wrong with an added request's prompt frames (the caller names the field)."""
        if prompt.dim() != 2 or tuple(prompt.shape) != (num_prompt_tokens, self.width + 1) or prompt.dtype != torch.int64:
            return f"prompt frames must be int64 [{num_prompt_tokens}, {self.width + 1}], got {prompt.dtype} {tuple(prompt.shape)}"
        have = len(self.generated.get(req_id, ()))
        if num_tokens - num_prompt_tokens > have:
            return f"{num_tokens - num_prompt_tokens} output positions but this worker generated {have} frames for the request"
        return None

    def add(self, slot: int, req_id: int, prompt: torch.Tensor, num_prompt_tokens: int, num_tokens: int) -> None:
        """A request added to `slot` (checked): its prompt frames, kept on the host like the generated frames
        (the store's copy is on the worker's device), so a step's input frames concatenate on one device."""
        self.prompts[slot] = (req_id, prompt.cpu())
        # The engine's outputs are the frames that count: any the worker made beyond them (none today:
        # a preempted request keeps its token in flight) must not sit before the next one.
        generated = self.generated.get(req_id)
        if generated is not None:
            del generated[num_tokens - num_prompt_tokens:]

    def remove(self, slot: int) -> None:
        entry = self.prompts.pop(slot, None)
        if entry is not None and entry[0] in self.ended:
            self._drop(entry[0])

    def release(self, req_id: int) -> None:
        """The graph request ended: its generated frames are no longer needed. A request that ends while
        its rows still run (a client left; the engine's abort comes in a later step) keeps them until the
        step that removes it."""
        if any(r == req_id for r, _ in self.prompts.values()):
            self.ended.add(req_id)
        else:
            self._drop(req_id)

    def _drop(self, req_id: int) -> None:
        self.ended.discard(req_id)
        self.generated.pop(req_id, None)
        self.generators.pop(req_id, None)

    def inputs(self, slots: np.ndarray, start: np.ndarray, num_new: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's input rows: every position's frame embedding, as (indices, rows) for `replace`."""
        parts = []
        for slot, s, n in zip(slots.tolist(), start.tolist(), num_new.tolist()):
            req_id, prompt = self.prompts[slot]
            p = prompt.shape[0]
            if s < p:
                parts.append(prompt[s:min(s + n, p)])
            if s + n > p:
                frames = self.generated[req_id][max(s, p) - p : s + n - p]
                parts.append(audio_frames(torch.from_numpy(np.stack(frames))))
        frames = torch.cat(parts)
        rows = self.model.backbone.embed(frames)
        return torch.arange(rows.shape[0], device=rows.device), rows

    def sample(self, h: torch.Tensor, codebook0: np.ndarray, states: list) -> tuple[np.ndarray, np.ndarray]:
        """After codebook 0 was drawn for the sampled rows (final-norm rows h [R, hidden], states their
        RequestStates): their frames [R, K] and the tokens the engine gets (codebook 0, or the stop id
        for a stop frame). Each frame is appended to its request's generated frames."""
        c0 = torch.from_numpy(codebook0.astype(np.int64)).to(h.device)
        frames = self.model.depth.frames(h, c0, self._sampler(states))
        stops = frame_stops(frames, self.model.eos).cpu().numpy()
        out = frames.cpu().numpy().astype(np.int32)
        tokens = np.where(stops, self.stop_token_id, out[:, 0]).astype(np.int32)
        for state, frame in zip(states, out):
            self.generated.setdefault(state.req_id, []).append(frame)
        return tokens, out

    def _sampler(self, states: list):
        temps = [float(s.sampling.temperature) for s in states]
        if all(t <= 0 for t in temps):
            return lambda logits, k: logits.argmax(dim=-1)

        def sample(logits: torch.Tensor, k: int) -> torch.Tensor:
            picks = logits.argmax(dim=-1)
            for i, (state, t) in enumerate(zip(states, temps)):
                if t <= 0:
                    continue
                row = logits[i] / t
                top_k = int(state.sampling.top_k)
                if 0 < top_k < row.shape[0]:
                    kth = torch.topk(row, top_k).values[-1]
                    row = row.masked_fill(row < kth, float("-inf"))
                probs = torch.softmax(row, dim=-1)
                picks[i] = torch.multinomial(probs.cpu(), 1, generator=self._generator(state)).to(picks.device)[0]
            return picks

        return sample

    def _generator(self, state) -> torch.Generator:
        g = self.generators.get(state.req_id)
        if g is None:
            g = torch.Generator()
            seed = state.sampling.seed
            if seed is None:
                g.seed()
            else:
                g.manual_seed((int(seed) * _SEED_STRIDE + 7) % (2**63))
            self.generators[state.req_id] = g
        return g
