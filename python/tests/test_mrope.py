"""Multimodal rotary positions (the Qwen2-VL family's M-RoPE): the worker's
cos/sin for (t, h, w) position streams equal transformers' Qwen2.5-VL rotary
embedding (contiguous sections) and Qwen3-Omni thinker's (interleaved), and
text positions (three equal streams) are plain rotary."""

from __future__ import annotations

import pytest
import torch

from baton_worker.model.config import RopeConfig
from baton_worker.model.rope import Rotary


def test_cos_sin_equal_transformers_qwen2_5_vl_rotary():
    from transformers import Qwen2_5_VLTextConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    section = [4, 6, 6]
    config = Qwen2_5_VLTextConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": section})
    theirs = Qwen2_5_VLRotaryEmbedding(config)
    ours = Rotary(RopeConfig(theta=1000000.0, mrope_section=tuple(section)), 32, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 5000, (3, 37), generator=g)
    cos, sin = theirs(torch.zeros(1, dtype=torch.float32), positions[:, None, :])
    our_cos, our_sin = ours.cos_sin(positions, torch.float32)
    assert torch.equal(our_cos, cos[0]) and torch.equal(our_sin, sin[0])
    # Equal streams (a text token) are the plain rotary of that position.
    flat = positions[0]
    plain_cos, plain_sin = ours.cos_sin(flat, torch.float32)
    same_cos, same_sin = ours.cos_sin(flat.expand(3, -1), torch.float32)
    assert torch.equal(plain_cos, same_cos) and torch.equal(plain_sin, same_sin)


def test_interleaved_cos_sin_equal_transformers_qwen3_omni_thinker_rotary():
    """Qwen3-Omni's thinker interleaves the streams (frequency i from stream i % 3 within the h and w
    sections); the config's rope_parameters say so with "interleaved"."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTextConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextRotaryEmbedding

    from baton_worker.model.config import _rope_config

    section = [6, 5, 5]
    params = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": section, "interleaved": True}
    config = Qwen3OmniMoeTextConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_parameters=params)
    theirs = Qwen3OmniMoeThinkerTextRotaryEmbedding(config)
    rope = _rope_config({"rope_parameters": params})
    assert rope.mrope_interleaved and rope.mrope_section == tuple(section)
    ours = Rotary(rope, 32, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    positions = torch.randint(0, 5000, (3, 41), generator=g)
    cos, sin = theirs(torch.zeros(1, dtype=torch.float32), positions[:, None, :])
    our_cos, our_sin = ours.cos_sin(positions, torch.float32)
    assert torch.equal(our_cos, cos[0]) and torch.equal(our_sin, sin[0])
    # Not the contiguous sections' layout: the two recompositions differ on these positions.
    contiguous = Rotary(RopeConfig(theta=1000000.0, mrope_section=tuple(section)), 32, torch.device("cpu"))
    assert not torch.equal(contiguous.cos_sin(positions, torch.float32)[0], our_cos)


def test_sections_must_cover_the_frequencies():
    with pytest.raises(ValueError, match=r"mrope_section \[2, 2, 2\] does not add up to the 16 rotary frequencies"):
        Rotary(RopeConfig(mrope_section=(2, 2, 2)), 32, torch.device("cpu"))
    with pytest.raises(ValueError, match="without mrope_section"):
        Rotary(RopeConfig(), 32, torch.device("cpu")).cos_sin(torch.zeros(3, 4, dtype=torch.int64), torch.float32)
