"""Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration) served from a Hugging Face
directory: image preprocessing (preprocess.py) and the windowed vision tower
(vision.py), whose image embeddings replace the <|image_pad|> rows of the
text model's prompt."""
