"""Multi-LoRA serving: PEFT adapters read and checked against the base model
(adapter.py), kept by id for the step runner (manager.py), and applied per
step to the decoder's projections for the rows that use them (batch.py:
batched torch on CPU, the Punica-style Triton kernels of kernels.py on CUDA).
"""

from .adapter import LoraAdapter, LoraLayout, LoraLoadError, read_adapter
from .batch import LoraBatch
from .manager import LoraManager

__all__ = ["LoraAdapter", "LoraBatch", "LoraLayout", "LoraLoadError", "LoraManager", "read_adapter"]
