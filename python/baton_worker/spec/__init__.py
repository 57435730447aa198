"""Speculative decoding: draft proposers (n-gram prompt lookup)."""

from .ngram import NgramProposer, propose_ngram

__all__ = ["NgramProposer", "propose_ngram"]
