"""Qwen3-Omni's talker in the worker's StepRunner, as CSM's backbone is run (models/csm/steps.py): the
talker's decoder as a kv_cache node's model, its input rows given by the frame hook (TalkerFrames), and
the code predictor run after every step's codebook-0 draw, for all the step's sampled rows at once.

What the engine sees. A talker request is a token request: its prompt ids are transformers'
talker_input_ids (talker_prompt_node.talker_prompt_ids: the user turns' thinker ids, then nine
<tts_pad>), and the token at each generated position is that frame's codebook 0; codec_eos, the node's
stop id, ends it. The whole frame (num_code_groups codes) goes back beside the token (StepResult.frames),
so the engine schedules, counts max tokens and stops on one id per position as for any decoder, and the
conductor streams frames to the code2wav node.

What the worker keeps (TalkerFrames), because no input row of the talker is a token embedding:
- per slot, the request's rows (AddedRequest.embeds: talker_prompt_node's `talker_embeds`, a tensor in
  the graph worker's store) [Q + S + 1, hidden]: the Q prompt rows, the text row of each of the first S
  decode steps, then the <tts_pad> row every later step takes;
- per request, the frames it generated, kept across preemption (a re-added request recomputes its
  inputs from them) until the graph request ends (GraphWork.finished_requests -> release()).
A step's input rows, put in place of every position's token embedding through the decoder's `replace`
path: prompt position p < Q takes row p; generated position Q + j takes the codec sum of frame j (the
frame drawn at position Q + j - 1; frame 0 is drawn at the prefill's last position) plus text row
Q + min(j, S), added in that order as transformers adds them.

Logits. The StepRunner's frame path scores codebook 0 with codebook0_logits and applies the layout's
logits_rules (TalkerLogitsRules: repetition penalty over the request's generated codebook-0 ids, then
the suppressed codec specials) before the draw, greedy or not, so that draw is transformers'.

Sampling. Codebook 0 goes through the worker's Sampler with the request's temperature, top-k, top-p and
seed (transformers' talker defaults: TALKER_SAMPLING). The code predictor follows the request: argmax when
the request is greedy (transformers mirrors talker_do_sample into it), otherwise its own fixed settings
(CODE_PREDICTOR_SAMPLING: temperature 1, top-k 50, then top-p 0.8, as transformers' warpers apply them)
drawn from a generator per request, seeded from the request's seed when it has one.

The stop draw. transformers makes no frame for the codec_eos draw (it builds a frame only as the next
step's input) and hands code2wav only the frames before it. Here every sampled row must return a frame,
so a codec_eos row returns codec_eos in every group without running the code predictor: a stop frame
that the code2wav node cuts the stream at (code2wav_node.py) and never decodes. A request stopped by its
max tokens has no stop frame: its last frame is a real one. (transformers' talker_max_new_tokens = N
also draws N times but makes frames of the first N - 1 draws only, so its audio is ours at max tokens
N - 1; ours at N has one frame more.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ...graph.model import KvDecoderLayout
from ..csm.model import Sample, greedy
from ..frame_requests import FrameRequests
from .talker import CODE_PREDICTOR_SAMPLING, Qwen3OmniTalker, TalkerLogitsRules, make_step_model, read_config



def talker_decoder_layout(model_dir: Path) -> KvDecoderLayout:
    """The talker kv_cache node's KvDecoderLayout: its own decoder (stored names), the logits rules and the
    frame hook. The node's kv input role is "embeds" (talker_embeds), its frame width num_code_groups and
    its stop id codec_eos."""
    return KvDecoderLayout(
        None,
        lambda name: name,
        read_config=read_config,
        make_decoder=make_step_model(model_dir),
        logits_rules=TalkerLogitsRules.from_dir,
        frames=lambda directory, model: TalkerFrames(model),
    )


def codec_sum(talker: Qwen3OmniTalker, frames: torch.Tensor) -> torch.Tensor:
    """frames [N, G] -> the codec part of the talker's next input rows [N, hidden]: codebook 0's
    codec_embedding row, then group k's code predictor embedding for k = 1..G-1, summed in that order
    (what CodePredictor.frames returns beside its frames, to the bit)."""
    predictor = talker.code_predictor
    frames = frames.to(device=talker.device, dtype=torch.int64)
    parts = [F.embedding(frames[:, 0], talker.codec_table)]
    parts += [F.embedding(frames[:, k], predictor.tables[k - 1]) for k in range(1, frames.shape[1])]
    return torch.stack(parts, dim=1).sum(dim=1)


def top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' TopKLogitsWarper then TopPLogitsWarper on float32 logits [R, V]: outside the k best,
    and past the smallest head of the ascending-sorted tail holding top_p of the mass, -inf."""
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(logits, dim=-1)
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop[:, -1] = False  # min_tokens_to_keep = 1
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return logits


class TalkerFrames(FrameRequests):
    """The StepRunner's frame inputs and code predictor (see the module docstring); per slot, the request's
    prompt length Q and its talker_embeds."""

    def __init__(self, model: Qwen3OmniTalker):
        super().__init__(seed_salt=11)
        self.model = model
        self.width = model.num_code_groups
        self.stop_token_id = model.eos  # codec_eos
        self.hidden = int(model.codec_table.shape[1])

    def check(self, rows: torch.Tensor, req_id: int, num_prompt_tokens: int, num_tokens: int) -> str | None:
        """None, or what is wrong with an added request's talker_embeds (the caller names the field)."""
        if rows.dim() != 2 or rows.shape[1] != self.hidden or not rows.dtype.is_floating_point or rows.shape[0] < num_prompt_tokens + 1:
            return (f"talker_embeds must be float [>= {num_prompt_tokens + 1}, {self.hidden}] (the {num_prompt_tokens} prompt rows, "
                    f"the text rows, the <tts_pad> row), got {rows.dtype} {tuple(rows.shape)}")
        return self.check_outputs(req_id, num_prompt_tokens, num_tokens)

    def add(self, slot: int, req_id: int, rows: torch.Tensor, num_prompt_tokens: int, num_tokens: int) -> None:
        """A request added to `slot` (checked): its rows, on the model's device in its dtype."""
        self.keep(slot, req_id, (num_prompt_tokens, rows.to(device=self.model.device, dtype=self.model.dtype)), num_prompt_tokens, num_tokens)

    def inputs(self, slots: np.ndarray, start: np.ndarray, num_new: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's input rows, every position's, as (indices, rows) for `replace`. The generated positions'
        codec sums are computed in one call for the whole step."""
        parts: list[torch.Tensor | None] = []
        frames, text, holes = [], [], []  # generated positions: their frames, text rows and part index
        for slot, s, n in zip(slots.tolist(), start.tolist(), num_new.tolist()):
            req_id, (q, rows) = self.slots[slot]
            if s < q:
                parts.append(rows[s : min(s + n, q)])
            if s + n > q:
                j = np.arange(max(s, q) - q, s + n - q)
                frames += self.generated[req_id][j[0] : j[-1] + 1]
                text.append(rows[torch.from_numpy(q + np.minimum(j, rows.shape[0] - q - 1)).to(rows.device)])
                holes.append(len(parts))
                parts.append(None)
        if holes:
            sums = codec_sum(self.model, torch.from_numpy(np.stack(frames)))
            # The text row is added last, as transformers adds it.
            generated = (sums + torch.cat(text)).split([t.shape[0] for t in text])
            for i, rows in zip(holes, generated):
                parts[i] = rows
        out = torch.cat(parts)
        return torch.arange(out.shape[0], device=out.device), out

    def sample(self, h: torch.Tensor, codebook0: np.ndarray, states: list) -> tuple[np.ndarray, np.ndarray]:
        """After codebook 0 was drawn for the sampled rows (final-norm rows h [R, hidden], states their
        RequestStates): the tokens the engine gets (codebook 0 as drawn) and the frames [R, G], each
        appended to its request's generated frames. A codec_eos row's frame is all codec_eos (the stop frame)."""
        tokens = np.asarray(codebook0, dtype=np.int64)
        out = np.full((len(tokens), self.width), self.stop_token_id, dtype=np.int64)
        speak = np.flatnonzero(tokens != self.stop_token_id)
        if len(speak):
            index = torch.from_numpy(speak).to(h.device)
            c0 = torch.from_numpy(tokens[speak]).to(h.device)
            codes, _ = self.model.code_predictor.frames(h.index_select(0, index), c0, self._sampler([states[i] for i in speak]))
            out[speak] = codes.cpu().numpy()
        out = out.astype(np.int32)
        self.append(states, out)
        return tokens.astype(np.int32), out

    def _sampler(self, states: list) -> Sample:
        """The code predictor's draw for these rows: argmax for greedy requests, else top-k / top-p at
        temperature 1 from each request's generator."""
        sampled = [i for i, s in enumerate(states) if float(s.sampling.temperature) > 0]
        if not sampled:
            return greedy
        temperature = float(CODE_PREDICTOR_SAMPLING["temperature"])
        top_k, top_p = int(CODE_PREDICTOR_SAMPLING["top_k"]), float(CODE_PREDICTOR_SAMPLING["top_p"])

        def sample(logits: torch.Tensor, k: int) -> torch.Tensor:
            picks = logits.argmax(dim=-1)
            rows = torch.tensor(sampled, device=logits.device)
            probs = top_k_top_p(logits.index_select(0, rows) / temperature, top_k, top_p).softmax(dim=-1).cpu()
            for row, p in zip(sampled, probs):
                picks[row] = torch.multinomial(p, 1, generator=self.generator(states[row]))[0].to(picks.device)
            return picks

        return sample
