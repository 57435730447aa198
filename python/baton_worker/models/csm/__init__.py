"""Sesame's CSM text-to-speech in plain PyTorch; mimi.py is its audio codec's decoder (codes -> 24 kHz PCM)."""
