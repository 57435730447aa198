// POST /score and POST /rerank on a classifier (Ready.pooling.task
// "classify": a cross-encoder, or a decoder served as Qwen3-Reranker), in
// vLLM's shapes. Each (text_1, text_2) pair is one prompt, encoded as the
// tokenizer encodes a text pair (tokenizer(text_1, text_2): BERT's
// [CLS] a [SEP] b [SEP], a byte-level BPE's plain concatenation, so a
// Qwen3-Reranker's client sends its prompt template already applied, as
// vLLM's examples do), and one prefill-only engine request (pooled-run.ts).
// The worker answers the classifier's logit; its score is the model's
// activation of it (scoreOf), unless the request says `activation: false`.
// On an embedding model (task "embed") each distinct text is embedded once
// and a pair's score is the cosine similarity of its two vectors, as vLLM
// scores with an embedding model.

import { randomUUID } from "node:crypto";
import { performance } from "node:perf_hooks";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { PoolingInfo } from "../transport/messages.js";
import type { FrontendContext } from "./context.js";
import { badRequest } from "./openai-error.js";
import { checkPromptLength, integerField, priorityOf, runPooled, truncationLength } from "./pooled-run.js";
import { checkAvailable, checkModel, unixSeconds } from "./run-generation.js";

const COMMON_FIELDS = ["model", "truncate_prompt_tokens", "priority", "activation", "user"];
const SCORE_FIELDS = new Set([...COMMON_FIELDS, "text_1", "text_2"]);
const RERANK_FIELDS = new Set([...COMMON_FIELDS, "query", "documents", "top_n", "return_documents"]);

/** Pairs to score, named for error messages. */
interface ScoringJob {
  model: string | null;
  pairs: [string, string][];
  /** What each pair is called in error messages (`text_2[3]`, `documents[0]`). */
  params: string[];
  /** What each pair's first text is called (`text_1`, `text_1[3]`, `query`). */
  firstParams: string[];
  keepTokens: number | null;
  priority: number;
  activation: boolean;
}

function bodyOf(raw: unknown): Record<string, unknown> {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw badRequest("the request body must be a JSON object");
  return raw as Record<string, unknown>;
}

function texts(value: unknown, name: string): string[] {
  if (typeof value === "string") return [value];
  if (Array.isArray(value) && value.every((x) => typeof x === "string")) {
    if (value.length === 0) throw badRequest(`${name} must not be empty`, name);
    return value as string[];
  }
  throw badRequest(`${name} must be a string or a list of strings`, name);
}

function commonFields(ctx: FrontendContext, body: Record<string, unknown>): Omit<ScoringJob, "pairs" | "params" | "firstParams"> {
  if (body.model !== undefined && body.model !== null && typeof body.model !== "string") throw badRequest("model must be a string", "model");
  const activation = body.activation ?? true;
  if (typeof activation !== "boolean") throw badRequest("activation must be a boolean", "activation");
  return { model: (body.model as string | undefined) ?? null, keepTokens: truncationLength(ctx, body), priority: priorityOf(ctx, body), activation };
}

/** vLLM's pairing: text_1 of one text goes with every text_2 (1-to-1, 1-to-N), else text_1[i] with text_2[i] (N-to-N). */
function parseScoreRequest(ctx: FrontendContext, body: Record<string, unknown>): ScoringJob {
  const first = texts(body.text_1, "text_1");
  const second = texts(body.text_2, "text_2");
  if (first.length > 1 && first.length !== second.length) {
    throw badRequest(`text_1 has ${first.length} texts and text_2 ${second.length}: the pairs must be 1-to-1, 1-to-N or N-to-N`, "text_2");
  }
  const pairs = second.map((text, i): [string, string] => [(first.length === 1 ? first[0] : first[i]) as string, text]);
  const params = second.map((_, i) => (typeof body.text_2 === "string" ? "text_2" : `text_2[${i}]`));
  const firstParams = second.map((_, i) => (typeof body.text_1 === "string" ? "text_1" : first.length === 1 ? "text_1[0]" : `text_1[${i}]`));
  return { ...commonFields(ctx, body), pairs, params, firstParams };
}

/** The texts' logit -> score, as the model scores (sentence-transformers' CrossEncoder and vLLM alike): the one place it is applied. */
function scoreOf(logit: number, pooling: PoolingInfo, activation: boolean): number {
  if (!activation || pooling.activation === "identity") return logit;
  return 1 / (1 + Math.exp(-logit));
}

interface Scored {
  scores: number[];
  numTokens: number;
}

/** Each pair's score, in pair order. */
async function scorePairs(ctx: FrontendContext, pooling: PoolingInfo, job: ScoringJob, id: string, reply: FastifyReply): Promise<Scored> {
  const arrivalMs = performance.now();
  checkModel(ctx, job.model);
  checkAvailable(ctx);
  if (pooling.task === "embed") return cosineScores(ctx, pooling, job, id, arrivalMs, reply);
  const prompts: number[][] = [];
  for (const [i, [first, second]] of job.pairs.entries()) {
    const ids = await ctx.tokenizer.encodePair(first, second, job.keepTokens);
    const param = job.params[i] as string;
    checkPromptLength(ctx, ids, param, `the pair of ${param}`);
    prompts.push(ids);
  }
  const logits = await runPooled(ctx, pooling, { id, prompts, params: job.params, priority: job.priority, arrivalMs }, reply);
  return { scores: logits.map((row) => scoreOf(row[0] as number, pooling, job.activation)), numTokens: prompts.reduce((sum, p) => sum + p.length, 0) };
}

/** An embedding model's scores: each distinct text embedded once (one prompt each), each pair's cosine similarity. */
async function cosineScores(ctx: FrontendContext, pooling: PoolingInfo, job: ScoringJob, id: string, arrivalMs: number, reply: FastifyReply): Promise<Scored> {
  const index = new Map<string, number>();
  const prompts: number[][] = [];
  const params: string[] = [];
  const place = async (text: string, param: string): Promise<number> => {
    const seen = index.get(text);
    if (seen !== undefined) return seen;
    let ids = await ctx.tokenizer.encode(text, true);
    if (job.keepTokens !== null && ids.length > job.keepTokens) ids = ids.slice(ids.length - job.keepTokens);
    checkPromptLength(ctx, ids, param, param);
    index.set(text, prompts.length);
    prompts.push(ids);
    params.push(param);
    return prompts.length - 1;
  };
  const rows: [number, number][] = [];
  for (const [i, [first, second]] of job.pairs.entries()) rows.push([await place(first, job.firstParams[i] as string), await place(second, job.params[i] as string)]);
  const vectors = await runPooled(ctx, pooling, { id, prompts, params, priority: job.priority, arrivalMs }, reply);
  return { scores: rows.map(([a, b]) => cosine(vectors[a]!, vectors[b]!)), numTokens: prompts.reduce((sum, p) => sum + p.length, 0) };
}

/** As torch's cosine_similarity: the dot product over the product of the norms, each at least 1e-8. */
function cosine(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let dot = 0;
  let aa = 0;
  let bb = 0;
  for (let i = 0; i < a.length; i++) {
    const x = a[i] as number;
    const y = b[i] as number;
    dot += x * y;
    aa += x * x;
    bb += y * y;
  }
  return dot / (Math.max(Math.sqrt(aa), 1e-8) * Math.max(Math.sqrt(bb), 1e-8));
}

export async function handleScore(ctx: FrontendContext, pooling: PoolingInfo, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const body = bodyOf(request.body);
  ctx.noteIgnoredFields("/score", Object.keys(body).filter((key) => !SCORE_FIELDS.has(key)));
  const id = `score-${randomUUID().replaceAll("-", "")}`;
  const { scores, numTokens } = await scorePairs(ctx, pooling, parseScoreRequest(ctx, body), id, reply);
  const data = scores.map((score, index) => ({ index, object: "score", score }));
  return { id, object: "list", created: unixSeconds(), model: ctx.servedModelName, data, usage: { prompt_tokens: numTokens, total_tokens: numTokens } };
}

export async function handleRerank(ctx: FrontendContext, pooling: PoolingInfo, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const body = bodyOf(request.body);
  ctx.noteIgnoredFields("/rerank", Object.keys(body).filter((key) => !RERANK_FIELDS.has(key)));
  if (typeof body.query !== "string") throw badRequest("query must be a string", "query");
  const query = body.query;
  if (!Array.isArray(body.documents) || !body.documents.every((d) => typeof d === "string")) throw badRequest("documents must be a list of strings", "documents");
  const documents = body.documents as string[];
  if (documents.length === 0) throw badRequest("documents must not be empty", "documents");
  const returnDocuments = body.return_documents ?? true;
  if (typeof returnDocuments !== "boolean") throw badRequest("return_documents must be a boolean", "return_documents");
  // vLLM's: top_n absent or not above 0 returns every document.
  const topN = integerField(body, "top_n") ?? 0;
  const job: ScoringJob = {
    ...commonFields(ctx, body),
    pairs: documents.map((document): [string, string] => [query, document]),
    params: documents.map((_, i) => `documents[${i}]`),
    firstParams: documents.map(() => "query"),
  };
  const id = `rerank-${randomUUID().replaceAll("-", "")}`;
  const { scores, numTokens } = await scorePairs(ctx, pooling, job, id, reply);
  // Highest first; a stable sort keeps ties in document order.
  const order = scores.map((_, index) => index).sort((a, b) => (scores[b] as number) - (scores[a] as number));
  const results = order.slice(0, topN > 0 ? topN : documents.length).map((index) => ({
    index,
    ...(returnDocuments ? { document: { text: documents[index] as string } } : {}),
    relevance_score: scores[index] as number,
  }));
  return { id, model: ctx.servedModelName, usage: { total_tokens: numTokens }, results };
}
