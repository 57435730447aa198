// POST /v1/completions: one or more prompts (text or token ids), n choices
// each, answered as one text_completion object or as a stream of
// text_completion chunks (choice index = prompt * n + i).

import { performance } from "node:perf_hooks";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { FrontendContext } from "./context.js";
import { TokenTextSession } from "../text/token-text.js";
import type { OpenAIFinishReason, ResolvedLogprob, ResolvedPromptLogprob } from "./generation.js";
import { CompletionLogprobsBuilder, generatedEntries, promptEntries, vllmPromptLogprobs, type CompletionLogprobs } from "./logprobs-format.js";
import { badRequest } from "./openai-error.js";
import { parseCompletionRequest } from "./request-validation.js";
import { attachGrammar, compileRequestGrammar } from "./structured-output.js";
import {
  buildChoices,
  checkAvailable,
  checkModel,
  collectGeneration,
  newRequestId,
  streamGeneration,
  unixSeconds,
  type StreamFormat,
  type Usage,
} from "./run-generation.js";

interface CompletionChoice {
  index: number;
  text: string;
  logprobs: CompletionLogprobs | null;
  finish_reason: OpenAIFinishReason | null;
  stop_reason: number | string | null;
  token_ids?: number[];
  prompt_token_ids?: number[];
  prompt_logprobs?: ReturnType<typeof vllmPromptLogprobs> | null;
}

/**
 * Each prompt token's share of the echoed text. For a text prompt the
 * tokens the tokenizer added (BOS) are not in the text and add ""; the
 * rest start the text (a SentencePiece decoder drops the first token's
 * leading space there, as in the text).
 */
async function echoTokenTexts(ctx: FrontendContext, prompt: string | number[], ids: number[]): Promise<string[]> {
  let from = 0;
  let to = ids.length;
  if (typeof prompt === "string") {
    const own = await ctx.tokenizer.encode(prompt, false);
    const at = indexOfRun(ids, own);
    if (at >= 0) [from, to] = [at, at + own.length];
  }
  const texts = new TokenTextSession(ctx.tokenizer.vocabulary, [], false).push(ids.slice(from, to), true).map((t) => t.text);
  return [...new Array<string>(from).fill(""), ...texts, ...new Array<string>(ids.length - to).fill("")];
}

function indexOfRun(haystack: readonly number[], needle: readonly number[]): number {
  outer: for (let i = 0; i + needle.length <= haystack.length; i++) {
    for (let j = 0; j < needle.length; j++) if (haystack[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}

export async function handleCompletion(ctx: FrontendContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const arrivalMs = performance.now();
  const req = parseCompletionRequest(request.body, { vocabSize: ctx.vocabSize });
  ctx.noteIgnoredFields("/v1/completions", req.ignoredFields);
  checkModel(ctx, req.model);
  checkAvailable(ctx);
  const prompts: number[][] = [];
  for (const [i, prompt] of req.prompts.entries()) {
    const ids = typeof prompt === "string" ? await ctx.tokenizer.encode(prompt, true) : prompt;
    const param = req.prompts.length === 1 ? "prompt" : `prompt[${i}]`;
    if (ids.length === 0) throw badRequest(`${param} must not be empty (it has no tokens)`, param);
    prompts.push(ids);
  }
  if (req.structuredOutput !== null) await compileRequestGrammar(ctx, req.structuredOutput, req);
  const id = newRequestId("cmpl");
  const specs = buildChoices(ctx, id, prompts, req, arrivalMs);
  if (req.structuredOutput !== null) attachGrammar(specs, { spec: req.structuredOutput.spec, reasoning: null });
  const created = unixSeconds();
  const model = ctx.servedModelName;
  const wantsLogprobs = req.logprobs >= 0;
  // Echoed with logprobs, the prompt's tokens lead the logprobs (scored by the prompt logprobs echo asks for).
  const echoLogprobs = req.echo && wantsLogprobs;

  // echo: the prompt's text comes first: as given, or for token ids their
  // texts joined (tokenizer.decode(ids), special tokens included, except that
  // a run of byte tokens that is not valid UTF-8 keeps the bytes that are).
  const promptTexts: string[] = [];
  const promptTokenTexts: string[][] = [];
  if (req.echo) {
    for (const [i, prompt] of req.prompts.entries()) {
      const ids = prompts[i] as number[];
      const texts = echoLogprobs || typeof prompt !== "string" ? await echoTokenTexts(ctx, prompt, ids) : [];
      promptTexts.push(typeof prompt === "string" ? prompt : texts.join(""));
      promptTokenTexts.push(texts);
    }
  }

  /** What a choice shows of its prompt and generation, from one delta or the whole. */
  const shape = (
    promptIndex: number,
    withEcho: boolean,
    text: string,
    tokenIds: number[],
    logprobs: readonly ResolvedLogprob[] | null,
    promptLogprobs: readonly ResolvedPromptLogprob[] | null,
    builder: CompletionLogprobsBuilder | null,
  ): { text: string; tokenIds: number[]; logprobs: CompletionLogprobs | null } => {
    // max_tokens 0 with echo: the one token generated is not shown.
    const generated = req.echoOnly ? { text: "", tokenIds: [], logprobs: [] } : { text, tokenIds, logprobs: logprobs ?? [] };
    const echo = withEcho ? (promptTexts[promptIndex] ?? "") : "";
    if (builder === null) return { text: echo + generated.text, tokenIds: generated.tokenIds, logprobs: null };
    const entries = [...(withEcho ? promptEntries(promptTokenTexts[promptIndex] ?? [], promptLogprobs) : []), ...generatedEntries(generated.logprobs)];
    return { text: echo + generated.text, tokenIds: generated.tokenIds, logprobs: builder.build(entries) };
  };

  // With max_tokens 0 nothing generated is shown, and none is counted.
  const shownUsage = (usage: Usage): Usage => (req.echoOnly ? { ...usage, completion_tokens: 0, total_tokens: usage.prompt_tokens } : usage);

  const choiceOf = (
    index: number,
    promptIndex: number,
    shown: { text: string; tokenIds: number[]; logprobs: CompletionLogprobs | null },
    finish: OpenAIFinishReason | null,
    stop: number | string | null,
    withPrompt: boolean,
  ): CompletionChoice => {
    const c: CompletionChoice = { index, text: shown.text, logprobs: shown.logprobs, finish_reason: finish, stop_reason: stop };
    if (req.returnTokenIds) {
      if (withPrompt) c.prompt_token_ids = prompts[promptIndex] as number[];
      c.token_ids = shown.tokenIds;
    }
    return c;
  };

  if (req.stream) {
    const started = new Set<number>();
    const builders = new Map<number, CompletionLogprobsBuilder>();
    const chunk = (choices: CompletionChoice[], usage?: Usage): object => ({
      id,
      object: "text_completion",
      created,
      model,
      choices,
      ...(req.includeUsage ? { usage: usage ?? null } : {}),
    });
    // The common stream (no echo, logprobs or token ids) builds its chunk directly: this
    // runs once per token per request on the main thread.
    const plain = !wantsLogprobs && !req.echo && !req.echoOnly && !req.returnTokenIds;
    const format: StreamFormat = {
      opening: () => [],
      delta(index, delta) {
        if (plain && delta.promptLogprobs === null) {
          const choice: CompletionChoice = { index, text: delta.text, logprobs: null, finish_reason: delta.finishReason, stop_reason: delta.stopReason };
          return chunk([choice]);
        }
        const spec = specs[index] as (typeof specs)[number];
        const first = !started.has(index);
        started.add(index);
        let builder: CompletionLogprobsBuilder | null = null;
        if (wantsLogprobs) {
          builder = builders.get(index) ?? new CompletionLogprobsBuilder(req.logprobs);
          builders.set(index, builder);
        }
        const shown = shape(spec.promptIndex, first && req.echo, delta.text, delta.tokenIds, delta.logprobs, delta.promptLogprobs, builder);
        const choice = choiceOf(index, spec.promptIndex, shown, delta.finishReason, delta.stopReason, first);
        if (delta.promptLogprobs !== null) choice.prompt_logprobs = vllmPromptLogprobs(delta.promptLogprobs);
        return chunk([choice]);
      },
      usage: (usage) => chunk([], shownUsage(usage)),
    };
    streamGeneration(ctx, specs, req, format, reply);
    return reply;
  }

  const result = await collectGeneration(ctx, specs, req, reply);
  const usage = shownUsage(result.usage);
  return {
    id,
    object: "text_completion",
    created,
    model,
    choices: result.choices.map((c) => {
      const builder = wantsLogprobs ? new CompletionLogprobsBuilder(req.logprobs) : null;
      const shown = shape(c.promptIndex, req.echo, c.text, c.tokenIds, c.logprobs, c.promptLogprobs, builder);
      const choice = choiceOf(c.index, c.promptIndex, shown, c.finishReason, c.stopReason, true);
      choice.prompt_logprobs = c.promptLogprobs === null ? null : vllmPromptLogprobs(c.promptLogprobs);
      return choice;
    }),
    usage,
  };
}
