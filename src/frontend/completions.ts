// POST /v1/completions: one or more prompts (text or token ids), n choices
// each, answered as one text_completion object or as a stream of
// text_completion chunks (choice index = prompt * n + i).

import { performance } from "node:perf_hooks";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { FrontendContext } from "./context.js";
import type { OpenAIFinishReason, ResolvedLogprob } from "./generation.js";
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

interface CompletionLogprobs {
  text_offset: number[];
  token_logprobs: (number | null)[];
  tokens: string[];
  top_logprobs: (Record<string, number> | null)[];
}

interface CompletionChoice {
  index: number;
  text: string;
  logprobs: CompletionLogprobs | null;
  finish_reason: OpenAIFinishReason | null;
  stop_reason: number | string | null;
  token_ids?: number[];
  prompt_token_ids?: number[];
}

/** JSON has no -Infinity; vLLM clamps the same way. */
export function clampLogprob(logprob: number): number {
  return Math.max(logprob, -9999);
}

/** Builds completions logprobs; offsets count characters from `offset`. */
class CompletionLogprobsBuilder {
  constructor(private offset: number) {}

  build(entries: readonly ResolvedLogprob[], promptTokens: readonly string[] = []): CompletionLogprobs {
    const out: CompletionLogprobs = { text_offset: [], token_logprobs: [], tokens: [], top_logprobs: [] };
    for (const token of promptTokens) {
      out.text_offset.push(this.offset);
      this.offset += token.length;
      out.tokens.push(token);
      out.token_logprobs.push(null);
      out.top_logprobs.push(null);
    }
    for (const entry of entries) {
      out.text_offset.push(this.offset);
      this.offset += entry.token.length;
      out.tokens.push(entry.token);
      out.token_logprobs.push(clampLogprob(entry.logprob));
      const top: Record<string, number> = {};
      if (entry.top.length > 0) {
        for (const t of entry.top) top[t.token] = clampLogprob(t.logprob);
        top[entry.token] = clampLogprob(entry.logprob);
      }
      out.top_logprobs.push(top);
    }
    return out;
  }
}

export async function handleCompletion(ctx: FrontendContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const arrivalMs = performance.now();
  const req = parseCompletionRequest(request.body, { vocabSize: ctx.vocabSize });
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

  // echo: the prompt's text (as given, or decoded from ids) comes first.
  const promptTexts: string[] = [];
  const promptTokenStrings: string[][] = [];
  if (req.echo) {
    for (const [i, prompt] of req.prompts.entries()) {
      promptTexts.push(typeof prompt === "string" ? prompt : await ctx.tokenizer.decode(prompt, false));
      promptTokenStrings.push(wantsLogprobs ? await ctx.tokenStrings.strings(prompts[i] as number[]) : []);
    }
  }

  const choiceOf = (
    index: number,
    promptIndex: number,
    text: string,
    ids: number[],
    logprobs: CompletionLogprobs | null,
    finish: OpenAIFinishReason | null,
    stop: number | string | null,
    withPrompt: boolean,
  ): CompletionChoice => {
    const c: CompletionChoice = { index, text, logprobs, finish_reason: finish, stop_reason: stop };
    if (req.returnTokenIds) {
      if (withPrompt) c.prompt_token_ids = prompts[promptIndex] as number[];
      c.token_ids = ids;
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
    const format: StreamFormat = {
      opening: () => [],
      delta(index, delta) {
        const spec = specs[index] as (typeof specs)[number];
        const first = !started.has(index);
        started.add(index);
        const echoText = first && req.echo ? (promptTexts[spec.promptIndex] ?? "") : "";
        let logprobs: CompletionLogprobs | null = null;
        if (wantsLogprobs) {
          let builder = builders.get(index);
          if (!builder) builders.set(index, (builder = new CompletionLogprobsBuilder(0)));
          logprobs = builder.build(delta.logprobs ?? [], first && req.echo ? promptTokenStrings[spec.promptIndex] : []);
        }
        return chunk([choiceOf(index, spec.promptIndex, echoText + delta.text, delta.tokenIds, logprobs, delta.finishReason, delta.stopReason, first)]);
      },
      usage: (usage) => chunk([], usage),
    };
    streamGeneration(ctx, specs, req, format, reply);
    return reply;
  }

  const result = await collectGeneration(ctx, specs, req, reply);
  return {
    id,
    object: "text_completion",
    created,
    model,
    choices: result.choices.map((c) => {
      const echoText = req.echo ? (promptTexts[c.promptIndex] ?? "") : "";
      const logprobs = wantsLogprobs
        ? new CompletionLogprobsBuilder(0).build(c.logprobs ?? [], req.echo ? promptTokenStrings[c.promptIndex] : [])
        : null;
      return choiceOf(c.index, c.promptIndex, echoText + c.text, c.tokenIds, logprobs, c.finishReason, c.stopReason, true);
    }),
    usage: result.usage,
  };
}
