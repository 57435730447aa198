"""The demo image model: builder, spec, PNG bytes, the graph declaration, and batch invariance.

The end-to-end parity (server vs reference loop) is test/e2e/images.test.ts;
here: what the nodes compute batched equals what the reference computes one
image at a time, pixel for pixel, so batching can never change an image.
"""

from __future__ import annotations

import json
import struct
import zlib

import pytest
import torch

from baton_worker.graph.export import export_graph
from baton_worker.graph.node_runner import NodePass, NodeRunner
from baton_worker.models.demo_image.build import build
from baton_worker.models.demo_image.graph_model import DENOISE_LOOP, BatonDemoImage
from baton_worker.models.demo_image.png import encode_png, to_pixels
from baton_worker.models.demo_image.reference import Reference
from baton_worker.models.demo_image.spec import DemoImageSpec, initial_latents, noise_seed, prompt_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build(tmp_path_factory.mktemp("demo-image"))


def test_build_is_deterministic_and_describes_itself(model_dir, tmp_path):
    again = build(tmp_path / "again")
    for name in ("config.json", "model.safetensors"):
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name
    spec = DemoImageSpec.from_dir(model_dir)
    assert spec == DemoImageSpec()
    block = json.loads((model_dir / "config.json").read_text())["image_generation"]
    assert block["sizes"] == ["32x32", "64x64", "128x128", "256x256"]
    assert block["latent_downsampling"] == 8 and block["max_prompt_tokens"] == 64


def test_prompt_ids_and_noise_seeds():
    text = DemoImageSpec().text
    ids = prompt_ids("hé", text)
    assert ids.tolist()[:4] == [text.bos, ord("h"), 0xC3, 0xA9] and ids.shape == (text.max_len,)
    assert set(ids.tolist()[4:]) == {text.pad}
    assert prompt_ids("x" * 500, text).tolist()[-1] == ord("x")  # cut, not padded
    assert noise_seed(7, 0) == noise_seed(7, 0) != noise_seed(7, 1) != noise_seed(8, 0)
    spec = DemoImageSpec()
    assert torch.equal(initial_latents(spec, "64x64", 7, 1), initial_latents(spec, "64x64", 7, 1))
    assert initial_latents(spec, "128x128", -3, 0).shape == (4, 16, 16)


def test_png_is_valid_rgb():
    pixels = torch.randint(0, 256, (5, 7, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    png = encode_png(pixels)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, depth, color = struct.unpack(">IIBB", png[16:26])
    assert (width, height, depth, color) == (7, 5, 8, 2)
    idat_len = struct.unpack(">I", png[33:37])[0]
    raw = zlib.decompress(png[41 : 41 + idat_len])
    rows = [raw[r * 22 + 1 : (r + 1) * 22] for r in range(5)]
    assert b"".join(rows) == pixels.numpy().tobytes()
    assert to_pixels(torch.tensor([[[0.0, 1.0, 0.5]], [[2.0, -1.0, 0.2]], [[0.0, 0.9, 0.999]]])).tolist() == [
        [[0, 255, 0], [255, 0, 230], [128, 51, 255]]
    ]


def test_exported_graph(model_dir):
    layout = export_graph(BatonDemoImage(model_dir))
    assert [n["name"] for n in layout["nodes"]] == ["text_encoder", "denoiser", "vae_decoder"]
    assert {n["engine"] for n in layout["nodes"]} == {"stateless"}
    loops = [s for s in layout["sections"] if s["kind"] == "loop"]
    assert [(l["loop_name"], l["max_iters"]) for l in loops] == [(DENOISE_LOOP, 50)]
    assert layout["client_outputs"] == [{"name": "image", "modality": "image"}]


def test_process_prompt_refuses_bad_sizes_and_steps(model_dir):
    model = BatonDemoImage(model_dir)
    with pytest.raises(ValueError, match="size '100x100' is not supported"):
        model.process_prompt("x", ["text"], ["image"], size="100x100", seed=1)
    with pytest.raises(ValueError, match="num_inference_steps must be an integer in 1..50"):
        model.process_prompt("x", ["text"], ["image"], num_inference_steps=0, seed=1)
    # msgpack carries a JS integer beyond 32 bits as a float: an integral one is a seed.
    values = model.process_prompt("x", ["text"], ["image"], seed=float(2**40), index=1)
    assert torch.equal(values["latents"][0], initial_latents(model.spec, "64x64", 2**40, 1))


def _run_loop(runner: NodeRunner, jobs: list[dict]) -> list[bytes]:
    """Runs the three nodes the way the conductor does, every request's passes in one batch per node."""
    store = runner.store
    prompts = [runner.process_prompt(j["prompt"], ["text"], ["image"], **j["kwargs"]) for j in jobs]
    kwargs = [j["kwargs"] for j in jobs]
    enc = runner.run("text_encoder", "generate", [NodePass(i, str(i), {"prompt_ids": p["prompt_ids"]}, request_kwargs=kwargs[i]) for i, p in enumerate(prompts)])
    state = {i: {"latents": p["latents"], "step": p["step"], "text_embeds": enc[i].outputs["text_embeds"]} for i, p in enumerate(prompts)}
    done: dict[int, list] = {}
    pass_id = 100
    while state:
        live = sorted(state)
        results = runner.run("denoiser", "generate", [NodePass(pass_id + k, str(i), dict(state[i]), request_kwargs=kwargs[i]) for k, i in enumerate(live)])
        pass_id += len(live)
        for i, r in zip(live, results):
            assert r.error is None, r.error
            state[i].update(latents=r.outputs["latents"], step=r.outputs["step"])
            if DENOISE_LOOP in r.stops:
                done[i] = r.outputs["latents"]
                del state[i]
    dec = runner.run("vae_decoder", "generate", [NodePass(900 + i, str(i), {"latents": done[i]}, request_kwargs=kwargs[i]) for i in sorted(done)])
    assert len(store) > 0
    return [r.client_chunks[0].data for r in dec]


def test_batched_nodes_give_the_reference_loops_bytes(model_dir):
    """Three requests (two sizes, different step counts) batched in every node == the reference, one image at a time."""
    jobs = [
        {"prompt": "a red fox", "kwargs": {"size": "64x64", "seed": 7, "index": 0, "num_inference_steps": 3}},
        {"prompt": "a red fox", "kwargs": {"size": "64x64", "seed": 7, "index": 1, "num_inference_steps": 5}},
        {"prompt": "the sea", "kwargs": {"size": "32x32", "seed": 2, "index": 0, "num_inference_steps": 2}},
    ]
    pngs = _run_loop(NodeRunner(BatonDemoImage(model_dir)), jobs)
    ref = Reference(model_dir)
    for png, job in zip(pngs, jobs):
        k = job["kwargs"]
        assert png == ref.generate(job["prompt"], k["size"], k["seed"], k["index"], k["num_inference_steps"])
    assert pngs[0] != pngs[1]
