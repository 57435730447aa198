"""Baton's model worker: loads an HF decoder, keeps the paged KV cache and
executes the engine's Steps (see server.py for the process, protocol.py for
the wire format)."""
