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
from ..frame_requests import FrameRequests
from .model import CsmBackbone, CsmDepthDecoder, audio_frames, csm_backbone_config, frame_stops, read_codebook_tables

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


class CsmFrames(FrameRequests):
    """The StepRunner's frame inputs and depth decoding (see the module docstring); per slot, the request's
    prompt frames [P, K+1]."""

    def __init__(self, model: CsmStepModel, stop_token_id: int):
        super().__init__(seed_salt=7)
        self.model = model
        self.width = model.num_codebooks
        self.stop_token_id = stop_token_id

    def check(self, prompt: torch.Tensor, req_id: int, num_prompt_tokens: int, num_tokens: int) -> str | None:
        """None, or what is wrong with an added request's prompt frames (the caller names the field)."""
        if prompt.dim() != 2 or tuple(prompt.shape) != (num_prompt_tokens, self.width + 1) or prompt.dtype != torch.int64:
            return f"prompt frames must be int64 [{num_prompt_tokens}, {self.width + 1}], got {prompt.dtype} {tuple(prompt.shape)}"
        return self.check_outputs(req_id, num_prompt_tokens, num_tokens)

    def add(self, slot: int, req_id: int, prompt: torch.Tensor, num_prompt_tokens: int, num_tokens: int) -> None:
        """A request added to `slot` (checked): its prompt frames, kept on the host like the generated frames
        (the store's copy is on the worker's device), so a step's input frames concatenate on one device."""
        self.keep(slot, req_id, prompt.cpu(), num_prompt_tokens, num_tokens)

    def inputs(self, slots: np.ndarray, start: np.ndarray, num_new: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's input rows: every position's frame embedding, as (indices, rows) for `replace`."""
        parts = []
        for slot, s, n in zip(slots.tolist(), start.tolist(), num_new.tolist()):
            req_id, prompt = self.slots[slot]
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
        self.append(states, out)
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
                picks[i] = torch.multinomial(probs.cpu(), 1, generator=self.generator(state)).to(picks.device)[0]
            return picks

        return sample
