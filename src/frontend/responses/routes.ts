// OpenAI's Responses API: POST /v1/responses (collected, streamed, or in the
// background), GET and DELETE /v1/responses/{id}, POST .../cancel and GET
// .../input_items. A request becomes the chat request of its conversation (a
// stored response's input and output first, with previous_response_id) and
// runs through the chat machinery (prepareChat: template, tools, grammar,
// images); its text comes back as output items (run.ts). Stored responses
// live in memory (store.ts).

import { performance } from "node:perf_hooks";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { prepareChat, type PreparedChat } from "../chat-completions.js";
import type { FrontendContext } from "../context.js";
import { ApiError, badRequest } from "../openai-error.js";
import { checkAvailable, checkModel, unixSeconds } from "../run-generation.js";
import { responsesError, toChatRequest } from "./chat-request.js";
import { ResponseEventStream } from "./event-stream.js";
import { conversationMessages, type PlacedItem } from "./input-messages.js";
import { newItemId, type ConversationItem, type ResponseObject } from "./items.js";
import { parseResponsesRequest, type ResponsesRequest } from "./request.js";
import { ResponseRun } from "./run.js";
import { ResponseStore, type ResponseStoreOptions, type StoredResponse } from "./store.js";

type IdRequest = FastifyRequest<{ Params: { id: string }; Querystring: Record<string, string | undefined> }>;

function notFound(id: string): ApiError {
  return new ApiError(404, `Response with id '${id}' not found.`, "invalid_request_error", null, "response_not_found");
}

function newResponse(id: string, req: ResponsesRequest, model: string, store: boolean): ResponseObject {
  return {
    id,
    object: "response",
    created_at: unixSeconds(),
    status: req.background ? "queued" : "in_progress",
    background: req.background,
    error: null,
    incomplete_details: null,
    instructions: req.instructions,
    max_output_tokens: req.maxOutputTokens,
    max_tool_calls: req.maxToolCalls,
    metadata: req.metadata,
    model,
    output: [],
    parallel_tool_calls: req.parallelToolCalls,
    previous_response_id: req.previousResponseId,
    reasoning: req.reasoning,
    service_tier: req.serviceTier ?? "auto",
    store,
    // The chat defaults the request ran with.
    temperature: req.temperature ?? 1,
    text: req.text,
    tool_choice: req.toolChoice,
    tools: req.tools,
    top_logprobs: 0,
    top_p: req.topP ?? 1,
    truncation: "disabled",
    usage: null,
    user: req.user,
    completed_at: null,
  };
}

class Responses {
  /** Runs not settled yet, stored or not (cancel and DELETE reach them here). */
  private readonly running = new Map<string, ResponseRun>();

  constructor(private readonly store: ResponseStore) {}

  /** The items a continued conversation starts with: the previous response's input, then its output. */
  private history(id: string | null): ConversationItem[] {
    if (id === null) return [];
    const previous = this.store.get(id);
    if (previous === undefined) throw badRequest(`Previous response with id '${id}' not found.`, "previous_response_id", "previous_response_not_found");
    const status = previous.response.status;
    if (status === "queued" || status === "in_progress") {
      throw badRequest(`Previous response with id '${id}' is still ${status}; continue from it once it has finished.`, "previous_response_id");
    }
    return [...previous.inputItems, ...previous.response.output];
  }

  async create(ctx: FrontendContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
    const arrivalMs = performance.now();
    const req = parseResponsesRequest(request.body);
    ctx.noteIgnoredFields("/v1/responses", req.ignoredFields);
    checkModel(ctx, req.model);
    checkAvailable(ctx);
    if (req.background && !this.store.enabled) {
      throw badRequest("background responses need the response store, which is off on this server (--responses-store-max-bytes 0)", "background");
    }
    const history = this.history(req.previousResponseId);
    const items: PlacedItem[] = [
      ...history.map((item) => ({ item, param: "previous_response_id" })),
      ...req.input.map((item, i) => ({ item, param: `input[${i}]` })),
    ];
    const conversation = conversationMessages(req.instructions, items);
    const chat = toChatRequest(req, conversation, { vocabSize: ctx.vocabSize, imageToken: ctx.vision?.imageToken ?? null, audioToken: ctx.audio?.audioToken ?? null });
    const id = newItemId("resp");
    let prepared: PreparedChat;
    try {
      prepared = await prepareChat(ctx, chat, id, arrivalMs);
    } catch (error) {
      throw responsesError(error, conversation.origins);
    }
    const stored = req.store && this.store.enabled;
    const response = newResponse(id, req, ctx.servedModelName, stored);
    const run = new ResponseRun(ctx, prepared, response, (error) => responsesError(error, conversation.origins) as ApiError);
    const refused = run.start();
    if (refused !== null) throw refused;
    this.track(run, stored ? { response, inputItems: [...history, ...req.input] } : null);
    // A response that is not in the background ends with its client.
    const cancelOnClose = (): void => {
      if (!req.background && !reply.raw.writableEnded) run.cancel();
    };
    if (req.stream) {
      reply.hijack();
      const hold = prepared.media !== null && prepared.media.images.length > 0;
      run.listen(new ResponseEventStream(reply.raw, () => run.error, hold));
      run.announce();
      reply.raw.on("close", cancelOnClose);
      // A client that left while the prompt was prepared: its close event has passed already.
      if (reply.raw.destroyed) cancelOnClose();
      return reply;
    }
    if (req.background) return structuredClone(response);
    reply.raw.on("close", cancelOnClose);
    if (reply.raw.destroyed) cancelOnClose();
    await run.settled;
    // As on the chat route, a generation that failed is an HTTP error; the stored response says "failed".
    if (run.error !== null) throw run.error;
    return response;
  }

  /** Keeps the run reachable while it runs; a stored response is pinned until it settles, then counted at its final size. */
  private track(run: ResponseRun, entry: StoredResponse | null): void {
    const id = run.response.id;
    this.running.set(id, run);
    if (entry !== null) this.store.put(id, entry, true);
    void run.settled.then(() => {
      this.running.delete(id);
      // Unless it was deleted meanwhile.
      if (entry !== null && this.store.get(id) !== undefined) this.store.put(id, entry);
    });
  }

  retrieve(request: IdRequest): ResponseObject {
    if (request.query.stream === "true") throw badRequest("streaming a stored response again is not supported; retrieve it without stream", "stream");
    const entry = this.store.get(request.params.id);
    if (entry === undefined) throw notFound(request.params.id);
    return entry.response;
  }

  delete(request: IdRequest): object {
    const id = request.params.id;
    if (this.store.get(id) === undefined) throw notFound(id);
    this.running.get(id)?.cancel();
    this.store.delete(id);
    return { id, object: "response", deleted: true };
  }

  cancel(request: IdRequest): ResponseObject {
    const id = request.params.id;
    const entry = this.store.get(id);
    if (entry === undefined) throw notFound(id);
    const response = entry.response;
    if (!response.background) throw badRequest(`Only responses created with background=true can be cancelled; '${id}' was not.`, "response_id");
    if (response.status === "queued" || response.status === "in_progress") this.running.get(id)?.cancel();
    else if (response.status !== "cancelled") throw badRequest(`Response '${id}' is already ${response.status} and cannot be cancelled.`, "response_id");
    return response;
  }

  /** The conversation a response continued from and its own input (OpenAI's input_items, newest first by default). */
  inputItems(request: IdRequest): object {
    const entry = this.store.get(request.params.id);
    if (entry === undefined) throw notFound(request.params.id);
    const { order = "desc", after, limit: limitText = "20" } = request.query;
    if (order !== "asc" && order !== "desc") throw badRequest(`order must be "asc" or "desc", got ${JSON.stringify(order)}`, "order");
    const limit = /^\d+$/.test(limitText) ? Number(limitText) : NaN;
    if (!(limit >= 1 && limit <= 100)) throw badRequest(`limit must be an integer from 1 to 100, got ${JSON.stringify(limitText)}`, "limit");
    let items = order === "asc" ? entry.inputItems : [...entry.inputItems].reverse();
    if (after !== undefined) {
      const at = items.findIndex((item) => item.id === after);
      if (at < 0) throw badRequest(`after: no input item with id '${after}' in response '${request.params.id}'`, "after");
      items = items.slice(at + 1);
    }
    const data = items.slice(0, limit);
    return { object: "list", data, first_id: data[0]?.id ?? null, last_id: data[data.length - 1]?.id ?? null, has_more: items.length > limit };
  }
}

/** The routes, over one store; textContext throws the 400 of a model without text output. */
export function registerResponsesRoutes(app: FastifyInstance, textContext: () => FrontendContext, options: ResponseStoreOptions): void {
  const responses = new Responses(new ResponseStore(options));
  app.post("/v1/responses", (request, reply) => responses.create(textContext(), request, reply));
  // These take no body, and the Python client sends an empty one with content-type JSON: their scope ignores bodies.
  void app.register(async (scope) => {
    scope.removeContentTypeParser("application/json");
    scope.addContentTypeParser("application/json", { parseAs: "buffer" }, (_request, _body, done) => done(null, undefined));
    scope.get("/v1/responses/:id", async (request: IdRequest) => responses.retrieve(request));
    scope.delete("/v1/responses/:id", async (request: IdRequest) => responses.delete(request));
    scope.post("/v1/responses/:id/cancel", async (request: IdRequest) => responses.cancel(request));
    scope.get("/v1/responses/:id/input_items", async (request: IdRequest) => responses.inputItems(request));
  });
}
