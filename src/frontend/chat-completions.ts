// POST /v1/chat/completions: messages rendered with the model's chat template,
// answered as one chat.completion or as chat.completion.chunk events (a role
// chunk per choice first, then content deltas, the finish reason on the last).

import { performance } from "node:perf_hooks";
import type { FastifyReply, FastifyRequest } from "fastify";
import { ChatTemplateError, noChatTemplateError, type TemplateMessage } from "../text/chat-template.js";
import { ChatAnswer, checkToolChoice, type ChatChoiceOutput } from "./chat-answer.js";
import type { FrontendContext } from "./context.js";
import type { OpenAIFinishReason } from "./generation.js";
import { chatLogprobs, vllmPromptLogprobs } from "./logprobs-format.js";
import { badRequest } from "./openai-error.js";
import { parseChatRequest, type ChatRequest } from "./request-validation.js";
import {
  buildChoices,
  checkAvailable,
  checkModel,
  collectGeneration,
  newRequestId,
  streamGeneration,
  unixSeconds,
  type ChoiceSpec,
  type StreamFormat,
  type Usage,
} from "./run-generation.js";
import { attachGrammar, compileRequestGrammar, toolChoiceGrammar } from "./structured-output.js";
import { withParsedToolArguments } from "./tool-request.js";
import { expandImageTokens, loadAudios, loadImages, promptMediaHash } from "./media.js";
import type { PromptMedia } from "../engine/types.js";

export interface ChatRenderRequest {
  messages: TemplateMessage[];
  addGenerationPrompt: boolean;
  continueFinalMessage: boolean;
  chatTemplateKwargs: Record<string, unknown>;
}

/**
 * The prompt text. continue_final_message renders the conversation without a
 * generation prompt and cuts it right after the last message's content, so
 * the model continues that message (transformers' continue_final_message).
 */
export function renderChatPrompt(ctx: FrontendContext, req: ChatRenderRequest): string {
  try {
    if (ctx.chatTemplate === null) throw noChatTemplateError(ctx.servedModelName);
    const rendered = ctx.chatTemplate.render(req.messages, { addGenerationPrompt: req.addGenerationPrompt, extra: req.chatTemplateKwargs });
    if (!req.continueFinalMessage) return rendered;
    const final = req.messages[req.messages.length - 1]?.content ?? "";
    const stripped = final.trim();
    if (stripped === "") return rendered;
    const at = rendered.lastIndexOf(stripped);
    if (at < 0) throw badRequest("continue_final_message: the final message's content does not appear in the rendered chat", "messages");
    const leftStripped = final.trimStart();
    const keep = rendered.slice(at, at + leftStripped.length) === leftStripped ? leftStripped.length : stripped.length;
    return rendered.slice(0, at + keep);
  } catch (error) {
    if (error instanceof ChatTemplateError) throw badRequest(error.message, error.param);
    throw error;
  }
}

/** A chat request ready to submit: its engine requests (one per choice) and how their text becomes answers. */
export interface PreparedChat {
  answer: ChatAnswer;
  promptIds: number[];
  media: PromptMedia | null;
  specs: ChoiceSpec[];
}

/**
 * Everything between a validated chat request and its submission (the
 * Responses API shares it): the tool choice checked, the grammar compiled and
 * attached, the prompt rendered and tokenized, images loaded and expanded.
 */
export async function prepareChat(ctx: FrontendContext, req: ChatRequest, id: string, arrivalMs: number): Promise<PreparedChat> {
  checkToolChoice(ctx, req);
  const forced = toolChoiceGrammar(req.tools.toolChoice, req.tools.functions, req.tools.parallelToolCalls);
  if (forced !== null && req.structuredOutput !== null) {
    throw badRequest(`${req.structuredOutput.param} cannot be combined with tool_choice "${req.tools.toolChoice.kind}" (its calls follow a grammar already)`, req.structuredOutput.param);
  }
  if (forced !== null && req.allowedTokenIds.length > 0) {
    throw badRequest(`allowed_token_ids cannot be combined with tool_choice "${req.tools.toolChoice.kind}" (its calls follow a grammar)`, "allowed_token_ids");
  }
  const grammar = forced ?? req.structuredOutput;
  if (grammar !== null) await compileRequestGrammar(ctx, grammar, req);
  const tools = req.tools.templateTools;
  const prompt = renderChatPrompt(ctx, {
    ...req,
    messages: withParsedToolArguments(req.messages),
    chatTemplateKwargs: tools.length > 0 ? { ...req.chatTemplateKwargs, tools } : req.chatTemplateKwargs,
  });
  // The template writes special tokens (BOS included) as text; adding them again would double them.
  let promptIds = await ctx.tokenizer.encode(prompt, false);
  if (promptIds.length === 0) throw badRequest("the rendered chat prompt is empty", "messages");
  let media: PromptMedia | null = null;
  if (ctx.vision !== null) {
    const images = await loadImages(req.images, ctx.media);
    ({ promptIds, media } = expandImageTokens(promptIds, ctx.vision, req.images, images));
  }
  if (ctx.audio !== null && req.audios.length > 0) {
    const clips = await loadAudios(req.audios, ctx.media);
    const placeholders = promptIds.filter((id) => id === ctx.audio!.audioTokenId).length;
    if (placeholders !== clips.length) {
      throw badRequest(`the prompt holds ${placeholders} audio placeholders (${JSON.stringify(ctx.audio.audioToken)}) for ${clips.length} audio parts; the text must not contain the placeholder itself`, "messages");
    }
    media = { spans: [], images: [], params: [], ...media, clips: clips.map((data, i) => ({ data, param: req.audios[i]!.param })) };
  }
  // Where the worker expands the placeholders (audio always), the engine roots the prompt's blocks in its media.
  if (media !== null && (ctx.audio !== null || ctx.vision?.expandsInWorker)) media.hash = promptMediaHash(media);
  const answer = new ChatAnswer(ctx, req, prompt);
  const specs = buildChoices(ctx, id, [promptIds], answer.generationRequest, arrivalMs);
  if (grammar !== null) attachGrammar(specs, { spec: grammar.spec, reasoning: answer.grammarReasoning() });
  if (media !== null) for (const spec of specs) spec.request.media = media;
  return { answer, promptIds, media, specs };
}

export async function handleChatCompletion(ctx: FrontendContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const arrivalMs = performance.now();
  const req = parseChatRequest(request.body, { vocabSize: ctx.vocabSize, imageToken: ctx.vision?.imageToken ?? null, audioToken: ctx.audio?.audioToken ?? null });
  ctx.noteIgnoredFields("/v1/chat/completions", req.ignoredFields);
  checkModel(ctx, req.model);
  checkAvailable(ctx);
  const id = newRequestId("chatcmpl");
  const { answer, promptIds, media, specs } = await prepareChat(ctx, req, id, arrivalMs);
  const genReq = answer.generationRequest;
  const created = unixSeconds();
  const model = ctx.servedModelName;

  if (req.stream) {
    const outputs = new Map<number, ChatChoiceOutput>(specs.map((spec) => [spec.index, answer.newChoice()]));
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
      opening: () =>
        specs.map((spec, i) =>
          chunk(
            [{ index: spec.index, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }],
            req.returnTokenIds && i === 0 ? { prompt_token_ids: promptIds } : {},
          ),
        ),
      delta(index, delta) {
        const shown = answer.deltas(outputs.get(index) as ChatChoiceOutput, delta.text, delta.finishReason);
        if (shown === null) return null;
        // The step's logprobs, ids and prompt logprobs go with its first chunk, the finish reason with its last.
        return shown.deltas.map((fields, k) => {
          const first = k === 0;
          const last = k === shown.deltas.length - 1;
          const choice: Record<string, unknown> = {
            index,
            delta: fields,
            logprobs: first && delta.logprobs ? chatLogprobs(delta.logprobs) : null,
            finish_reason: last ? shown.finishReason : null,
          };
          if (last && delta.finishReason !== null) choice.stop_reason = delta.stopReason;
          if (req.returnTokenIds) choice.token_ids = first ? delta.tokenIds : [];
          // vLLM puts prompt_logprobs on the response; in a stream, on the first chunk with tokens.
          return chunk([choice], first && delta.promptLogprobs !== null ? { prompt_logprobs: vllmPromptLogprobs(delta.promptLogprobs) } : {});
        });
      },
      usage: (usage) => chunk([], {}, usage),
    };
    // With images, headers wait for the worker to have decoded them (a bad image is a 400, not a failed stream).
    streamGeneration(ctx, specs, genReq, format, reply, undefined, media !== null && media.images.length > 0);
    return reply;
  }

  const result = await collectGeneration(ctx, specs, genReq, reply);
  return {
    id,
    object: "chat.completion",
    created,
    model,
    choices: result.choices.map((c) => {
      const { message, finishReason } = answer.message(c.text, c.finishReason satisfies OpenAIFinishReason);
      const choice: Record<string, unknown> = {
        index: c.index,
        message,
        logprobs: c.logprobs ? chatLogprobs(c.logprobs) : null,
        finish_reason: finishReason,
        stop_reason: c.stopReason,
      };
      if (req.returnTokenIds) choice.token_ids = c.tokenIds;
      return choice;
    }),
    usage: result.usage,
    prompt_logprobs: result.choices[0]?.promptLogprobs ? vllmPromptLogprobs(result.choices[0].promptLogprobs) : null,
    ...(req.returnTokenIds ? { prompt_token_ids: promptIds } : {}),
  };
}
