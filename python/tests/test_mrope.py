"""Multimodal rotary positions (the Qwen2-VL family's M-RoPE): the worker's
cos/sin for (t, h, w) position streams equal transformers' Qwen2.5-VL rotary
embedding, and text positions (three equal streams) are plain rotary."""

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


def test_sections_must_cover_the_frequencies():
    with pytest.raises(ValueError, match=r"mrope_section \[2, 2, 2\] does not add up to the 16 rotary frequencies"):
        Rotary(RopeConfig(mrope_section=(2, 2, 2)), 32, torch.device("cpu"))
    with pytest.raises(ValueError, match="without mrope_section"):
        Rotary(RopeConfig(), 32, torch.device("cpu")).cos_sin(torch.zeros(3, 4, dtype=torch.int64), torch.float32)
