"""Qwen3-Omni's `talker_prompt` node: a stateless node that turns a finished thinker's tokens into every
input row the talker will read (`talker_embeds`, the talker kv_cache node's AddedRequest.embeds), run
once per request after the thinker has stopped, on the talker's worker.

Inputs (one pass per request):
- `prompt_ids`: the thinker's prompt, int64 [P] (one tensor, or several read in order);
- `generated_ids`: every token the thinker generated, in order, its final eos included when it stopped
  on one, int64 [T] (likewise);
- `mm_hidden` (optional): the thinker's rows at layer accept_hidden_layer at the prompt's audio / image /
  video positions, in order, [M, thinker hidden]; required when the prompt has such positions.
Request kwargs: `voice` (or `speaker`): the speaker's name, any case; default "ethan", else the config's
first speaker.

Output `talker_embeds` [Q + S + 1, talker hidden] in the node's dtype:
- rows 0..Q-1: the talker's prompt (talker.talker_prompt: the user turns' rows, then the nine assistant
  rows with the speaker), Q = len(talker_prompt_ids(prompt)), the talker request's prompt length;
- rows Q..Q+S-1: the text row of decode steps 0..S-1 as transformers' generate builds them: text_projection
  of the thinker's embedding rows from the assistant header a on, up to but not including the sequence's
  last token (generate never embeds it), in ONE call as generate makes it (so these are its bits); rows
  a..a+3 are the prompt's, step j takes the row of token a + 4 + j, then <tts_text_eod>; where the first
  generated token in THINKER_EOS is generated token e, step e takes <tts_text_eod> and later steps <tts_pad>
  (generate's masking; without a thinker eos before the end it changes nothing);
- row Q + S: <tts_pad>, the text row of every later step (TalkerFrames uses row Q + min(j, S)).
For a prompt that ends with the assistant header (a + 3 = P) and a thinker that stopped on its eos after
T tokens, S = T - 1: one text row per generated token but the first (in the prompt rows) and the last.
transformers fails on T = 1 (its assistant rows come up short); here a single generated token gives
S = 1: step 0 takes <tts_text_eod>, as generate's formula would.

Weights: the thinker's whole input embedding table (thinker.model.embed_tokens: vocabulary x thinker
hidden; for Qwen3-Omni-30B-A3B 152064 x 2048: 0.62 GB in bfloat16, 1.25 GB in float32) on the node's
device, beside the talker's text_projection, hidden_projection and codec_embedding (a few MB). The table
is loaded whole: any token may be spoken, and gathering rows on the thinker's worker instead would make
the thinker's partition produce one more tensor per request. Nothing is kept between passes.

Passes run one after another in a forward: each is one request's projection calls, shaped as generate
shapes them (batching requests would change the calls' shapes, and so their rounding).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from ...model.config import read_json
from ...model.weights import WeightReader
from .talker import CODEC_TABLE, THINKER_EOS, THINKER_TABLE, ResizeMLP, TalkerIds, assistant_start, talker_prompt, user_positions

PROMPT_IDS = "prompt_ids"
GENERATED_IDS = "generated_ids"
MM_HIDDEN = "mm_hidden"
OUTPUT = "talker_embeds"
SPEAKER_KWARGS = ("voice", "speaker")  # the frontend's name for it, then generate's
DEFAULT_SPEAKER = "ethan"


def talker_prompt_ids(prompt_ids: np.ndarray | torch.Tensor, ids: TalkerIds) -> torch.Tensor:
    """The talker request's prompt ids [Q] (generate's talker_input_ids), from the thinker's prompt alone:
    the user turns' thinker ids (user_positions), then nine <tts_pad>. What process_prompt gives the talker
    node as its engine prompt; the same ids talker_prompt returns."""
    tokens = np.asarray(torch.as_tensor(prompt_ids).cpu(), dtype=np.int64).reshape(-1)
    assistant_start(tokens, ids)  # the prompt must end in an assistant turn for the talker to speak
    return torch.cat((torch.from_numpy(tokens[user_positions(tokens, ids)]), torch.full((9,), ids.tts_pad, dtype=torch.int64)))


def default_speaker(ids: TalkerIds) -> str:
    if DEFAULT_SPEAKER in ids.speakers:
        return DEFAULT_SPEAKER
    if not ids.speakers:
        raise ValueError("the config names no speaker (talker_config.speaker_id)")
    return next(iter(ids.speakers))


def _ids(items: list[torch.Tensor], name: str) -> np.ndarray:
    for t in items:
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise ValueError(f"{name!r} must be integer token ids; got {t.dtype} {tuple(t.shape)}")
    if not items:
        return np.zeros(0, np.int64)
    return np.concatenate([np.asarray(t.detach().cpu(), dtype=np.int64).reshape(-1) for t in items])


class TalkerPromptNode(torch.nn.Module):
    """The `talker_prompt` node's submodule (see the module docstring). It carries what talker.talker_prompt
    reads of a talker (ids, device, dtype, config.hidden_size, text_projection, hidden_projection, tts_rows,
    codec_table) without the talker's decoder."""

    def __init__(self, reader, config: dict[str, Any]):
        super().__init__()
        self.ids = TalkerIds.from_config(config)
        self.device, self.dtype = reader.device, reader.dtype
        self.thinker_table = reader.get(THINKER_TABLE)
        self.codec_table = reader.get(CODEC_TABLE)
        self.text_projection = ResizeMLP(reader, "talker.text_projection.")
        self.hidden_projection = ResizeMLP(reader, "talker.hidden_projection.")
        self.config = SimpleNamespace(hidden_size=int(self.codec_table.shape[1]))  # what talker_prompt reads of it
        ids = self.ids
        # As generate (and Qwen3OmniTalker) project them: one call over the three rows.
        self.tts_rows = self.text_projection(self.thinker_table[[ids.tts_bos, ids.tts_eos, ids.tts_pad]][None])[0]

    def prepare_inputs(self, graph_walk: str, info, inputs: Mapping[str, list[torch.Tensor]]):
        """-> (prompt ids [P], the whole sequence [P + T], mm_hidden or None, speaker), checked."""
        prompt = _ids(list(inputs.get(PROMPT_IDS, [])), PROMPT_IDS)
        generated = _ids(list(inputs.get(GENERATED_IDS, [])), GENERATED_IDS)
        vocab = self.thinker_table.shape[0]
        for name, t in ((PROMPT_IDS, prompt), (GENERATED_IDS, generated)):
            bad = np.flatnonzero((t < 0) | (t >= vocab))
            if bad.size:
                raise ValueError(f"{name}[{int(bad[0])}]: {int(t[bad[0]])} is outside the thinker's vocabulary of {vocab}")
        if not len(generated):
            raise ValueError("the thinker generated no token: there is nothing for the talker to say")
        hidden = list(inputs.get(MM_HIDDEN, []))
        mm_hidden = torch.cat([t.reshape(-1, t.shape[-1]) for t in hidden]) if hidden else None
        count = int(np.isin(prompt, self.ids.multimodal).sum())
        if count and mm_hidden is None:
            raise ValueError(f"the prompt has {count} audio / image / video positions: the talker needs the thinker's layer-"
                             f"{self.ids.accept_hidden_layer} rows there ({MM_HIDDEN!r}), none were given")
        kwargs = info.request_kwargs if info is not None else {}
        speaker = next((kwargs[k] for k in SPEAKER_KWARGS if kwargs.get(k) is not None), None)
        speaker = default_speaker(self.ids) if speaker is None else str(speaker)
        self.ids.speaker_id(speaker)  # an unknown speaker fails its own request here
        return prompt, np.concatenate((prompt, generated)), mm_hidden, speaker

    def preprocess(self, graph_walk: str, infos, prepared: list):
        return prepared

    @torch.inference_mode()
    def forward(self, graph_walk: str, infos, batch: list) -> list[dict[str, list[torch.Tensor]]]:
        return [{OUTPUT: [self.embeds(*item)]} for item in batch]

    @torch.inference_mode()
    def embeds(self, prompt: np.ndarray, sequence: np.ndarray, mm_hidden: torch.Tensor | None, speaker: str) -> torch.Tensor:
        """One request's talker_embeds [Q + S + 1, hidden] (the module docstring)."""
        ids, p, n = self.ids, len(prompt), len(sequence)
        a = assistant_start(prompt, ids)
        if n < a + 4:
            raise ValueError(f"the talker needs the thinker's first text token (position {a + 3}); the sequence has {n} tokens")
        table = self.thinker_table
        # generate's assistant rows: a .. n - 2 (its thinker_embed stops before the last token), at least a + 3.
        assistant = torch.from_numpy(sequence[a : max(n - 1, a + 4)]).to(self.device)
        projected = self.text_projection(table[assistant])
        # talker_prompt reads the rows of the prompt and of token a + 3 (the first text token).
        embeds = table[torch.from_numpy(sequence[: max(p, a + 4)]).to(self.device)]
        rows, _ = talker_prompt(self, torch.from_numpy(prompt), embeds, mm_hidden, speaker)
        bos, eod, pad = self.tts_rows
        trailing = torch.cat((projected[4 : n - 1 - a], eod[None]))
        generated = sequence[p:]
        eos = np.flatnonzero(np.isin(generated, THINKER_EOS))
        if len(eos) and eos[0] < trailing.shape[0]:
            e = int(eos[0])
            trailing = torch.cat((trailing[:e], eod[None], pad.expand(trailing.shape[0] - e - 1, -1)))
        return torch.cat((rows, trailing, pad[None]))


def load_talker_prompt_node(model_dir: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> TalkerPromptNode:
    """The talker_prompt node's submodule for a Qwen3-Omni directory (in the talker's dtype, for its bits)."""
    model_dir = Path(model_dir)
    reader = WeightReader(model_dir, dtype, torch.device(device))
    try:
        return TalkerPromptNode(reader, read_json(model_dir / "config.json"))
    finally:
        reader.close()
