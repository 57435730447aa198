"""LLaVA (LlavaForConditionalGeneration) served from a Hugging Face directory:
a stateless `vision` node (CLIP vision tower + multi-modal projector) feeding
the `llm` node's prefill. See graph_model.py."""
