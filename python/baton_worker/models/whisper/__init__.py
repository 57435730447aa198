"""Whisper (WhisperForConditionalGeneration) in plain PyTorch: the log-mel
front end (features.py), the audio encoder (encoder.py) and a tiny
random-weight directory builder for tests (build.py)."""
