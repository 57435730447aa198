// How a chat request's choices turn generated text into response fields:
// which reasoning parser and tool-call parser apply (server flags and the
// request's tool_choice), the message of a collected choice, the delta of a
// streamed one, and the finish reason ("tool_calls" once a choice called a
// tool and stopped). Each choice's text goes through one ChatChoiceOutput:
// reasoning (--reasoning-parser) split from the answer, then tool calls (a
// tool-call parser, with tool_choice "auto") split from the rest of the
// answer. The same object serves both forms: a stream pushes each piece as
// it becomes final and sends what comes out; a collected response pushes the
// whole text once. Any split of the text gives the same result.

import { ReasoningSplitter, reasoningStart, THINK_END, THINK_START, type ReasoningStart } from "../reasoning/reasoning-parser.js";
import type { RequestGrammar } from "../structured/answer-phase.js";
import { NamedCallParser, RequiredCallsParser } from "../tool-parsers/forced.js";
import { joinToolCallDeltas, mergeToolCallDeltas, ToolCallEmitter, type ToolCall, type ToolCallDelta } from "../tool-parsers/tool-call.js";
import { createToolCallParser, toolCallIdStyle, type ToolCallParser } from "../tool-parsers/tool-parser.js";
import type { FrontendContext } from "./context.js";
import type { OpenAIFinishReason } from "./generation.js";
import { badRequest } from "./openai-error.js";
import type { ChatRequest } from "./request-validation.js";
import type { ToolChoice } from "./tool-request.js";

export type ChatFinishReason = OpenAIFinishReason | "tool_calls";

/** Refuses tool choices the server cannot serve (before anything is generated). */
export function checkToolChoice(ctx: FrontendContext, req: ChatRequest): void {
  const choice = req.tools.toolChoice;
  if (choice.kind === "auto" && (!ctx.enableAutoToolChoice || ctx.toolCallParser === null)) {
    throw badRequest('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set', "tool_choice");
  }
}

export class ChatAnswer {
  private readonly start: ReasoningStart | null;
  /** How the answer's tool calls are read: the model's own format (auto), or the shape a forced choice's grammar gives it. */
  private readonly tools: ToolChoice["kind"];
  /** Whether the answer is parsed for tool calls in the model's own format. */
  readonly parsesToolCalls: boolean;

  constructor(
    private readonly ctx: FrontendContext,
    private readonly req: ChatRequest,
    prompt: string,
  ) {
    this.start = ctx.reasoningParser === null ? null : reasoningStart(ctx.reasoningParser, prompt);
    this.tools = req.tools.toolChoice.kind;
    this.parsesToolCalls = this.tools === "auto" && ctx.toolCallParser !== null;
  }

  /**
   * Where a grammar starts in the output: after the thinking, when a
   * reasoning parser expects some (structured output is for the answer).
   */
  grammarReasoning(): RequestGrammar["reasoning"] {
    if (this.start === null || this.start === "content") return null;
    const startTokenId = this.ctx.tokenizer.tokenToId(THINK_START);
    const endTokenId = this.ctx.tokenizer.tokenToId(THINK_END);
    if (startTokenId === null || endTokenId === null) {
      throw badRequest(`structured output with --reasoning-parser needs ${THINK_START} and ${THINK_END} to be tokens of the model's vocabulary`);
    }
    return { start: this.start, startTokenId, endTokenId };
  }

  /**
   * The request as generation sees it: with tool parsing, special tokens stay
   * in the text, since some models' call markers are special tokens
   * ([TOOL_CALLS], <|python_tag|>, <tool_call> in some tokenizers).
   */
  get generationRequest(): ChatRequest {
    return this.parsesToolCalls ? { ...this.req, skipSpecialTokens: false } : this.req;
  }

  newChoice(): ChatChoiceOutput {
    const reasoning = this.start === null ? null : new ReasoningSplitter(this.start);
    const parserName = this.ctx.toolCallParser;
    const emitter = new ToolCallEmitter(parserName === null ? "openai" : toolCallIdStyle(parserName), this.req.tools.parallelToolCalls);
    const choice = this.req.tools.toolChoice;
    if (choice.kind === "named") return new ChatChoiceOutput(reasoning, new NamedCallParser(emitter, choice.name));
    if (choice.kind === "required") return new ChatChoiceOutput(reasoning, new RequiredCallsParser(emitter));
    if (!this.parsesToolCalls || parserName === null) return new ChatChoiceOutput(reasoning, null);
    return new ChatChoiceOutput(reasoning, createToolCallParser(parserName, emitter, this.req.tools.functions));
  }

  /**
   * A streamed choice's deltas for this text, one per chunk: reasoning and
   * content first, then each tool-call delta in its own chunk (a call's name,
   * then its argument fragments, as OpenAI streams them). null when there is
   * nothing to send yet; never empty with a finish reason.
   */
  deltas(output: ChatChoiceOutput, text: string, finishReason: OpenAIFinishReason | null): { deltas: Record<string, unknown>[]; finishReason: ChatFinishReason | null } | null {
    let piece = output.push(text);
    if (finishReason !== null) piece = joinPieces(piece, output.finish());
    if (finishReason === null && isEmptyPiece(piece)) return null;
    const deltas: Record<string, unknown>[] = [];
    const fields: Record<string, unknown> = {};
    if (piece.content !== "") fields.content = piece.content;
    if (piece.reasoning !== "" && this.req.includeReasoning) fields.reasoning_content = piece.reasoning;
    if (Object.keys(fields).length > 0 || piece.toolCalls.length === 0) deltas.push(fields);
    for (const call of piece.toolCalls) deltas.push({ tool_calls: [call] });
    return { deltas, finishReason: finishReason === null ? null : this.finishReason(output, finishReason) };
  }

  /** A collected choice's message and finish reason. */
  message(text: string, finishReason: OpenAIFinishReason): { message: Record<string, unknown>; finishReason: ChatFinishReason } {
    const output = this.newChoice();
    const piece: ChatPiece = joinPieces(output.push(text), output.finish());
    const message: Record<string, unknown> = { role: "assistant" };
    const calls = toolCallsOf(piece);
    if (this.start === null && this.tools === "none") message.content = piece.content;
    else message.content = piece.content === "" && (calls.length > 0 || this.start !== null) ? null : piece.content;
    if (this.start !== null) message.reasoning_content = piece.reasoning === "" || !this.req.includeReasoning ? null : piece.reasoning;
    if (calls.length > 0) message.tool_calls = calls;
    return { message, finishReason: this.finishReason(output, finishReason) };
  }

  /** "tool_calls" once the choice called a tool and stopped; a call forced by name stops with "stop", as OpenAI's do. */
  private finishReason(output: ChatChoiceOutput, reason: OpenAIFinishReason): ChatFinishReason {
    return reason === "stop" && output.numToolCalls > 0 && this.tools !== "named" ? "tool_calls" : reason;
  }
}

// ---- one choice's text ------------------------------------------------------

/** What one piece of generated text adds to a chat choice. */
export interface ChatPiece {
  reasoning: string;
  content: string;
  toolCalls: ToolCallDelta[];
}

export class ChatChoiceOutput {
  private numCalls = 0;

  constructor(
    private readonly reasoning: ReasoningSplitter | null,
    private readonly tools: ToolCallParser | null,
  ) {}

  /** Tool calls begun so far. */
  get numToolCalls(): number {
    return this.numCalls;
  }

  push(text: string): ChatPiece {
    const split = this.reasoning === null ? { reasoning: "", content: text } : this.reasoning.push(text);
    return this.answer(split.reasoning, split.content, false);
  }

  /** The end of the choice's text: everything held back comes out. */
  finish(): ChatPiece {
    const split = this.reasoning === null ? { reasoning: "", content: "" } : this.reasoning.finish();
    return this.answer(split.reasoning, split.content, true);
  }

  private answer(reasoning: string, content: string, final: boolean): ChatPiece {
    if (this.tools === null) return { reasoning, content, toolCalls: [] };
    const piece = this.tools.push(content);
    const calls = piece.calls;
    let text = piece.content;
    if (final) {
      const last = this.tools.finish();
      text += last.content;
      joinToolCallDeltas(calls, last.calls);
    }
    for (const call of calls) if (call.id !== undefined) this.numCalls++;
    return { reasoning, content: text, toolCalls: calls };
  }
}

function joinPieces(a: ChatPiece, b: ChatPiece): ChatPiece {
  return { reasoning: a.reasoning + b.reasoning, content: a.content + b.content, toolCalls: joinToolCallDeltas([...a.toolCalls], b.toolCalls) };
}

function isEmptyPiece(piece: ChatPiece): boolean {
  return piece.reasoning === "" && piece.content === "" && piece.toolCalls.length === 0;
}

/** A collected choice's tool calls. */
function toolCallsOf(piece: ChatPiece): ToolCall[] {
  return mergeToolCallDeltas(piece.toolCalls);
}
