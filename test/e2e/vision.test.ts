// LLaVA through HTTP: greedy chat answers with images equal transformers'
// LlavaForConditionalGeneration.generate (its own LlavaProcessor builds the
// prompt and the pixel values), for two text backbones and both feature
// strategies, with chunked prefill cutting through the image tokens; the prefix
// cache keys image tokens by the image; bad media is a 400 naming the part.

import assert from "node:assert/strict";
import { copyFileSync, mkdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { after, before, describe, test } from "node:test";
import { demoModelDir, postJson, removeDir, repoRoot, runPython, runPythonAsync, startServer, tempDir, type RunningServer } from "./harness.js";

const MAX_TOKENS = 10;
const BLOCK_SIZE = 4;
/** random_llava.py's image token (Qwen3's <|image_pad|> id, renamed <image>). */
const IMAGE_TOKEN_ID = 151655;


interface Case {
  /** Content parts: an image file name, or text. */
  parts: ({ image: string } | { text: string })[];
  stream?: boolean;
}

interface ChatBody {
  choices: { message: { content: string }; token_ids: number[] }[];
  prompt_token_ids: number[];
  usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } };
  error?: { message: string };
}

const MIME: Record<string, string> = { png: "image/png", jpg: "image/jpeg", webp: "image/webp", gif: "image/gif" };

function dataUrl(dir: string, name: string, mime = MIME[name.split(".").pop()!]!): string {
  return `data:${mime};base64,${readFileSync(join(dir, name)).toString("base64")}`;
}

function chatBody(content: unknown[], extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { messages: [{ role: "user", content }], max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true, ...extra };
}

function partsOf(images: string, c: Case): unknown[] {
  return c.parts.map((p) => ("image" in p ? { type: "image_url", image_url: { url: dataUrl(images, p.image) } } : { type: "text", text: p.text }));
}

/** The chat in transformers' form: the reference renders it with the processor's apply_chat_template. */
function hfMessages(c: Case): { role: string; content: ({ type: "image" } | { type: "text"; text: string })[] }[] {
  return [{ role: "user", content: c.parts.map((p) => ("image" in p ? { type: "image" as const } : { type: "text" as const, text: p.text })) }];
}

/** Runs beside the server's start-up (both mostly wait on torch loading). */
async function reference(modelDir: string, images: string, cases: Case[]): Promise<{ prompt_ids: number[]; tokens: number[] }[]> {
  const input = JSON.stringify({
    model_dir: modelDir,
    max_new_tokens: MAX_TOKENS,
    cases: cases.map((c) => ({
      messages: hfMessages(c),
      images: c.parts.flatMap((p) => ("image" in p ? [readFileSync(join(images, p.image)).toString("base64")] : [])),
    })),
  });
  return (JSON.parse(await runPythonAsync([join(repoRoot, "python", "tests", "llava_reference.py")], input)) as { results: { prompt_ids: number[]; tokens: number[] }[] }).results;
}

/** A streamed chat's token ids (the SSE chunks' token_ids, in order). */
async function streamedIds(url: string, body: Record<string, unknown>): Promise<{ status: number; ids: number[] }> {
  const response = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...body, stream: true }) });
  const text = await response.text();
  const ids: number[] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const chunk = JSON.parse(line.slice(6)) as { choices: { token_ids?: number[] }[] };
    for (const choice of chunk.choices) ids.push(...(choice.token_ids ?? []));
  }
  return { status: response.status, ids };
}

const CASES: Case[] = [
  { parts: [{ image: "a.png" }, { text: "What is in this picture?" }] },
  { parts: [{ text: "Compare" }, { image: "b.jpg" }, { text: "with" }, { image: "c.webp" }] },
  { parts: [{ text: "No picture here, just words about the weather today." }] },
  { parts: [{ image: "d.png" }] },
  { parts: [{ image: "e.png" }, { text: "What is in this picture?" }], stream: true },
  { parts: [{ image: "c.webp" }, { text: "Describe it in detail, please." }] },
];
/** Case 0's text with an image no request has sent before (the prefix-cache miss). */
const FRESH = 6;
const REFERENCE_CASES: Case[] = [...CASES, { parts: [{ image: "g.png" }, { text: "What is in this picture?" }] }];

interface Backbone {
  arch: string;
  variant: number;
  extra: string[];
  /** Serve flags beyond the common ones. */
  serve: string[];
}

const BACKBONES: Backbone[] = [
  // 24 blocks of 4 tokens for six concurrent prompts of 30-60 tokens: requests are
  // preempted and recompute their prompts, image features included.
  { arch: "llama", variant: 0, extra: [], serve: ["--num-gpu-blocks-override", "24"] },
  // CLS kept and two feature layers concatenated: 17 tokens per image.
  { arch: "qwen2", variant: 1, extra: ["--select", "full", "--feature-layer=-1,-3"], serve: [] },
];

let images = "";
let allowed = "";

before(() => {
  images = tempDir("vision-images");
  runPython([join(repoRoot, "python", "tests", "random_llava.py"), "--images", images]);
  allowed = join(images, "allowed");
  mkdirSync(allowed);
  copyFileSync(join(images, "a.png"), join(allowed, "a.png"));
});

after(() => removeDir(images));

for (const [index, backbone] of BACKBONES.entries()) {
  describe(`LLaVA over ${backbone.arch} through HTTP`, () => {
    let dir = "";
    let server: RunningServer | null = null;
    // Kept so that after() stops a server whose start outlived a failed before() (the reference failing first).
    let starting: Promise<RunningServer> | null = null;
    let url = "";
    let expected: { prompt_ids: number[]; tokens: number[] }[] = [];

    before(async () => {
      dir = tempDir(`vision-${backbone.arch}`);
      runPython([join(repoRoot, "python", "tests", "random_llava.py"), "--text-arch", backbone.arch, "--variant", String(backbone.variant), "--out", dir, ...backbone.extra]);
      starting = startServer([
        dir,
        "--served-model-name", "llava",
        "--dtype", "float32",
        // Fewer than one image's 16-17 tokens: prefill chunks cut through images.
        "--max-num-batched-tokens", "8",
        "--block-size", String(BLOCK_SIZE),
        "--limit-mm-per-prompt", '{"image": 2}',
        "--allowed-local-media-path", allowed,
        ...backbone.serve,
      ]);
      [server, expected] = await Promise.all([starting, reference(dir, images, REFERENCE_CASES)]);
      url = `${server.url}/v1/chat/completions`;
    });

    after(async () => {
      const started = await starting?.catch(() => null);
      await (server ?? started)?.stop();
      removeDir(dir);
    });

    test("greedy answers equal transformers generate, concurrent and chunked", async () => {
      const got = await Promise.all(
        CASES.map(async (c) => {
          const body = chatBody(partsOf(images, c));
          if (c.stream === true) {
            const { status, ids } = await streamedIds(url, body);
            return { status, ids, promptIds: null as number[] | null, text: "" };
          }
          const response = await postJson<ChatBody>(url, body);
          assert.equal(response.status, 200, JSON.stringify(response.body));
          return { status: response.status, ids: response.body.choices[0]!.token_ids, promptIds: response.body.prompt_token_ids, text: "" };
        }),
      );
      got.forEach((g, i) => {
        assert.equal(g.status, 200);
        if (g.promptIds !== null) assert.deepEqual(g.promptIds, expected[i]!.prompt_ids, `case ${i}: prompt ids (image token count)`);
        assert.deepEqual(g.ids, expected[i]!.tokens, `case ${i}: greedy tokens`);
      });
      // The reference's answers depend on the image, not just the text.
      assert.notDeepEqual(expected[0]!.tokens, expected[4]!.tokens);
      if (backbone.serve.length > 0) {
        const metrics = await (await fetch(`${server!.url}/metrics`)).text();
        const preemptions = Number(/vllm:num_preemptions_total\{[^}]*\} (\d+)/.exec(metrics)?.[1] ?? "0");
        assert.ok(preemptions > 0, "the KV cache was meant to be too small for all at once");
      }
    });

    test("the prefix cache hits the same image and misses another at and after its first block", async () => {
      const same = chatBody(partsOf(images, CASES[0]!));
      const first = await postJson<ChatBody>(url, same);
      const second = await postJson<ChatBody>(url, same);
      assert.equal(second.status, 200);
      assert.ok(second.body.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(second.body.usage));
      assert.deepEqual(second.body.choices[0]!.token_ids, first.body.choices[0]!.token_ids);
      // Same text, another image: only blocks wholly before the image may hit.
      const other = await postJson<ChatBody>(url, chatBody(partsOf(images, REFERENCE_CASES[FRESH]!)));
      assert.equal(other.status, 200);
      const firstImageToken = other.body.prompt_token_ids.indexOf(IMAGE_TOKEN_ID);
      assert.ok(firstImageToken >= 0);
      assert.ok(other.body.usage.prompt_tokens_details.cached_tokens <= Math.floor(firstImageToken / BLOCK_SIZE) * BLOCK_SIZE, JSON.stringify(other.body.usage));
      assert.deepEqual(other.body.choices[0]!.token_ids, expected[FRESH]!.tokens);
    });

    test("an allowed local file is served like its data: URL", async () => {
      const response = await postJson<ChatBody>(url, chatBody([{ type: "image_url", image_url: { url: pathToFileURL(join(allowed, "a.png")).href } }, { type: "text", text: "What is in this picture?" }]));
      assert.equal(response.status, 200, JSON.stringify(response.body));
      assert.deepEqual(response.body.choices[0]!.token_ids, expected[0]!.tokens);
    });

    test("/tokenize counts a chat with images as chat's prompt_tokens", async () => {
      for (const i of [0, 1]) {
        const messages = [{ role: "user", content: partsOf(images, CASES[i]!) }];
        const [tokenized, chat] = await Promise.all([
          postJson<{ count: number; tokens: number[]; error?: { message: string } }>(`${server!.url}/tokenize`, { model: "llava", messages }),
          postJson<ChatBody>(url, { ...chatBody(messages[0]!.content), max_tokens: 1 }),
        ]);
        assert.equal(tokenized.status, 200, JSON.stringify(tokenized.body));
        assert.equal(chat.status, 200, JSON.stringify(chat.body));
        assert.equal(tokenized.body.count, chat.body.usage.prompt_tokens, `case ${i}`);
        assert.deepEqual(tokenized.body.tokens, chat.body.prompt_token_ids, `case ${i}`);
        assert.ok(tokenized.body.tokens.filter((id) => id === IMAGE_TOKEN_ID).length > CASES[i]!.parts.length, `case ${i}: image tokens expanded`);
      }
    });

    if (index > 0) return;

    const text = { type: "text", text: "What is this?" };
    const image = (u: string): unknown => ({ type: "image_url", image_url: { url: u } });
    const BAD: { name: string; content: () => unknown[]; status: number; says: RegExp }[] = [
      { name: "wrong base64", content: () => [image("data:image/png;base64,@@not*base64@@"), text], status: 400, says: /messages\[0\]\.content\[0\].*base64/ },
      { name: "truncated PNG", content: () => [text, image(dataUrl(images, "truncated.png"))], status: 400, says: /messages\[0\]\.content\[1\]: cannot decode the image/ },
      { name: "zero-size image", content: () => [image("data:image/png;base64,"), text], status: 400, says: /messages\[0\]\.content\[0\]: the image is empty/ },
      { name: "GIF declared as GIF", content: () => [image(dataUrl(images, "f.gif")), text], status: 400, says: /content\[0\]: unsupported media type "image\/gif"/ },
      { name: "GIF declared as PNG", content: () => [image(dataUrl(images, "f.gif", "image/png")), text], status: 400, says: /content\[0\]: unsupported image format GIF/ },
      { name: "text/plain", content: () => [image("data:text/plain;base64,aGVsbG8="), text], status: 400, says: /unsupported media type "text\/plain"/ },
      { name: "too many images", content: () => [image(dataUrl(images, "a.png")), image(dataUrl(images, "a.png")), image(dataUrl(images, "a.png")), text], status: 400, says: /at most 2 images/ },
      { name: "disallowed URL", content: () => [image("https://example.com/cat.png"), text], status: 400, says: /content\[0\]: fetching images from "example\.com" is not allowed/ },
      { name: "disallowed local path", content: () => [image(pathToFileURL(join(images, "a.png")).href), text], status: 400, says: /content\[0\]: .* is outside the allowed local media path/ },
      { name: "placeholder typed in the text", content: () => [{ type: "text", text: "look: <image>" }], status: 400, says: /image placeholders/ },
    ];

    test("bad media is a 400 naming the part, and the server serves on", async () => {
      for (const bad of BAD) {
        const response = await postJson<ChatBody>(url, chatBody(bad.content()));
        assert.equal(response.status, bad.status, `${bad.name}: ${JSON.stringify(response.body)}`);
        assert.match(response.body.error?.message ?? "", bad.says, bad.name);
      }
      // Streamed: still a plain 400, never a 200 stream that then fails.
      const streamed = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...chatBody([text, image(dataUrl(images, "truncated.png"))]), stream: true }) });
      assert.equal(streamed.status, 400);
      assert.match(((await streamed.json()) as ChatBody).error?.message ?? "", /content\[1\]: cannot decode the image/);
      const good = await postJson<ChatBody>(url, chatBody(partsOf(images, CASES[0]!)));
      assert.equal(good.status, 200);
      assert.deepEqual(good.body.choices[0]!.token_ids, expected[0]!.tokens);
    });
  });
}

describe("a model without vision", () => {
  let server: RunningServer | null = null;

  before(async () => {
    server = await startServer([demoModelDir]);
  });

  after(async () => {
    await server?.stop();
  });

  test("refuses an image part with a 400", async () => {
    const response = await postJson<ChatBody>(`${server!.url}/v1/chat/completions`, chatBody([{ type: "image_url", image_url: { url: dataUrl(images, "a.png") } }, { type: "text", text: "hi" }]));
    assert.equal(response.status, 400);
    assert.match(response.body.error?.message ?? "", /messages\[0\]\.content\[0\]: this model does not take images/);
  });
});
