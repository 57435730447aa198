"""Baton's demo text-to-speech model: a Llama LLM streaming audio codes to a convolutional codec.

    spec.py         vocabulary layout, codec and stream settings (config.json's one definition)
    build.py        the deterministic builder: python -m baton_worker.models.demo_tts.build --out DIR
    text.py         prompts ([bos, voice, UTF-8 bytes, start_of_speech]) and the tokenizer files
    codec.py        the convolutional decoder, code frames -> 24 kHz PCM
    streaming.py    the llm -> codec window arithmetic and the `codec` node's submodule
    audio.py        PCM -> s16le bytes (postprocess)
    reference.py    the plain-PyTorch reference loop (transformers + the same codec)
    graph_model.py  BatonDemoTTS, the graph declaration (imports baton_worker.graph)

Nothing here imports baton_worker.graph except graph_model.py, so the model,
builder and reference work without the graph runtime.
"""
