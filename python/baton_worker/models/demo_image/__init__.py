"""Baton's demo image-generation model: text encoder -> denoiser loop -> VAE-style decoder.

    spec.py         sizes, step bounds, network shapes, prompt ids, noise seeds (config.json's one definition)
    networks.py     the three networks (text encoder, denoiser, decoder), float64, and their random weights
    schedule.py     the DDIM (eta 0) noise schedule and update the denoiser applies each step
    pipeline.py     the batched steps (encode, one denoise step, decode) the nodes and the reference share
    png.py          RGB pixels -> PNG bytes (postprocess)
    build.py        the deterministic builder: python -m baton_worker.models.demo_image.build --out DIR
    reference.py    the plain-PyTorch reference loop over the same weights
    graph_model.py  BatonDemoImage, the graph declaration (imports baton_worker.graph)

Nothing here imports baton_worker.graph except graph_model.py, so the model,
builder and reference work without the graph runtime.
"""
