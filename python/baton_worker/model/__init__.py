"""The decoder LLM: its config, weights (read from safetensors or made at
random), rotary embeddings, the layer's small operations (torch, or Triton
kernels on CUDA) and the forward pass over a flat batch of new tokens."""
