"""Qwen3-Omni (Qwen3OmniMoeForConditionalGeneration: thinker, talker, code2wav) served from a Hugging Face directory."""
