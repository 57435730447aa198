// POST /v1/completions: a text or token-id prompt, answered as one
// text_completion object or as a stream of text_completion chunks.

import { performance } from "node:perf_hooks";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { FrontendContext } from "./context.js";
import type { OpenAIFinishReason } from "./generation.js";
import { badRequest } from "./openai-error.js";
import { parseCompletionRequest } from "./request-validation.js";
import {
  buildEngineRequest,
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
  logprobs: null;
  finish_reason: OpenAIFinishReason | null;
  stop_reason: number | null;
  token_ids?: number[];
  prompt_token_ids?: number[];
}

export async function handleCompletion(ctx: FrontendContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const arrivalMs = performance.now();
  const req = parseCompletionRequest(request.body, { vocabSize: ctx.vocabSize });
  checkModel(ctx, req.model);
  checkAvailable(ctx);
  const promptIds = typeof req.prompt === "string" ? await ctx.tokenizer.encode(req.prompt, true) : req.prompt;
  if (promptIds.length === 0) throw badRequest("prompt must not be empty (it has no tokens)", "prompt");
  const id = newRequestId("cmpl");
  const engineRequest = buildEngineRequest(ctx, id, promptIds, req, arrivalMs);
  const created = unixSeconds();
  const model = ctx.servedModelName;

  const choice = (text: string, ids: number[], finish: OpenAIFinishReason | null, stop: number | null, withPrompt: boolean): CompletionChoice => {
    const c: CompletionChoice = { index: 0, text, logprobs: null, finish_reason: finish, stop_reason: stop };
    if (req.returnTokenIds) {
      if (withPrompt) c.prompt_token_ids = promptIds;
      c.token_ids = ids;
    }
    return c;
  };

  if (req.stream) {
    let first = true;
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
      delta(text, ids, finish, stop) {
        const c = choice(text, ids, finish, stop, first);
        first = false;
        return chunk([c]);
      },
      usage: (usage) => chunk([], usage),
    };
    streamGeneration(ctx, engineRequest, req.skipSpecialTokens, req.includeUsage, format, reply);
    return reply;
  }

  const result = await collectGeneration(ctx, engineRequest, req.skipSpecialTokens, reply);
  return {
    id,
    object: "text_completion",
    created,
    model,
    choices: [choice(result.text, result.tokenIds, result.finishReason, result.stopReason, true)],
    usage: result.usage,
  };
}
