// POST /v1/chat/completions: messages rendered with the model's chat template,
// answered as one chat.completion or as chat.completion.chunk events (a role
// chunk first, then content deltas, the finish reason on the last one).

import { performance } from "node:perf_hooks";
import type { FastifyReply, FastifyRequest } from "fastify";
import { ChatTemplateError, noChatTemplateError } from "../text/chat-template.js";
import type { FrontendContext } from "./context.js";
import type { OpenAIFinishReason } from "./generation.js";
import { badRequest } from "./openai-error.js";
import { parseChatRequest, type ChatRequest } from "./request-validation.js";
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

function renderPrompt(ctx: FrontendContext, req: ChatRequest): string {
  try {
    if (ctx.chatTemplate === null) throw noChatTemplateError(ctx.servedModelName);
    return ctx.chatTemplate.render(req.messages, { addGenerationPrompt: req.addGenerationPrompt, extra: req.chatTemplateKwargs });
  } catch (error) {
    if (error instanceof ChatTemplateError) throw badRequest(error.message, error.param);
    throw error;
  }
}

export async function handleChatCompletion(ctx: FrontendContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const arrivalMs = performance.now();
  const req = parseChatRequest(request.body, { vocabSize: ctx.vocabSize });
  checkModel(ctx, req.model);
  checkAvailable(ctx);
  // The template writes special tokens (BOS included) as text; adding them again would double them.
  const promptIds = await ctx.tokenizer.encode(renderPrompt(ctx, req), false);
  if (promptIds.length === 0) throw badRequest("the rendered chat prompt is empty", "messages");
  const id = newRequestId("chatcmpl");
  const engineRequest = buildEngineRequest(ctx, id, promptIds, req, arrivalMs);
  const created = unixSeconds();
  const model = ctx.servedModelName;

  if (req.stream) {
    const chunk = (choices: object[], extra: object = {}, usage?: Usage): object => ({
      id,
      object: "chat.completion.chunk",
      created,
      model,
      ...extra,
      choices,
      ...(req.includeUsage ? { usage: usage ?? null } : {}),
    });
    const format: StreamFormat = {
      opening: () => [
        chunk(
          [{ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }],
          req.returnTokenIds ? { prompt_token_ids: promptIds } : {},
        ),
      ],
      delta(text, ids, finish, stop) {
        const choice: Record<string, unknown> = {
          index: 0,
          delta: text === "" ? {} : { content: text },
          logprobs: null,
          finish_reason: finish,
        };
        if (finish !== null) choice.stop_reason = stop;
        if (req.returnTokenIds) choice.token_ids = ids;
        return chunk([choice]);
      },
      usage: (usage) => chunk([], {}, usage),
    };
    streamGeneration(ctx, engineRequest, req.skipSpecialTokens, req.includeUsage, format, reply);
    return reply;
  }

  const result = await collectGeneration(ctx, engineRequest, req.skipSpecialTokens, reply);
  const choice: Record<string, unknown> = {
    index: 0,
    message: { role: "assistant", content: result.text },
    logprobs: null,
    finish_reason: result.finishReason satisfies OpenAIFinishReason,
    stop_reason: result.stopReason,
  };
  if (req.returnTokenIds) choice.token_ids = result.tokenIds;
  return {
    id,
    object: "chat.completion",
    created,
    model,
    choices: [choice],
    usage: result.usage,
    ...(req.returnTokenIds ? { prompt_token_ids: promptIds } : {}),
  };
}
