// Structured output on the frontend: a request's grammar (from its structured
// output fields, or from a forced tool choice) is compiled before anything is
// submitted, so a schema or grammar the engine cannot use is the client's 400
// naming the problem; then every choice's engine request carries it.

import type { RequestGrammar } from "../structured/answer-phase.js";
import type { GrammarSpec } from "../structured/grammar-spec.js";
import { GrammarUnavailableError } from "../structured/grammar-service.js";
import type { ToolFunction } from "../tool-parsers/tool-call.js";
import type { FrontendContext } from "./context.js";
import { badRequest, serviceUnavailable } from "./openai-error.js";
import type { SamplingRequest } from "./request-validation.js";
import type { RequestedGrammar } from "./structured-request.js";
import type { ChoiceSpec } from "./run-generation.js";
import type { ToolChoice } from "./tool-request.js";

/**
 * Compiles the request's grammar: 400 when it cannot be compiled (or cannot
 * work with the request's other parameters), 503 when the grammar engine is
 * down.
 */
export async function compileRequestGrammar(ctx: FrontendContext, grammar: RequestedGrammar, req: SamplingRequest): Promise<void> {
  const { spec, param } = grammar;
  if (ctx.grammars === null) throw badRequest("structured outputs are not available on this server", param);
  // A grammar allows EOS exactly where the output may end; these would fight it.
  if (req.minTokens > 0) throw badRequest("min_tokens cannot be combined with structured output", "min_tokens");
  if (req.ignoreEos) throw badRequest("ignore_eos cannot be combined with structured output", "ignore_eos");
  let error: string | null;
  try {
    error = await ctx.grammars.compile(spec);
  } catch (e) {
    if (e instanceof GrammarUnavailableError) throw serviceUnavailable(e.message);
    throw e;
  }
  if (error !== null) throw badRequest(`${param}: the grammar engine cannot use it: ${error}`, param);
}

/** Every choice's engine request follows the grammar. */
export function attachGrammar(specs: readonly ChoiceSpec[], grammar: RequestGrammar): void {
  for (const spec of specs) spec.request.grammar = grammar;
}

/**
 * The grammar a forced tool choice imposes: a named function's arguments
 * object, or (required) a list of {"name", "parameters"} calls of the offered
 * functions (one call at most without parallel_tool_calls).
 */
export function toolChoiceGrammar(choice: ToolChoice, functions: readonly ToolFunction[], parallel: boolean): RequestedGrammar | null {
  const parametersOf = (fn: ToolFunction): Record<string, unknown> => fn.parameters ?? { type: "object" };
  if (choice.kind === "named") {
    const fn = functions.find((f) => f.name === choice.name) as ToolFunction;
    return { spec: { kind: "json_schema", source: JSON.stringify(parametersOf(fn)) }, param: `tools[${functions.indexOf(fn)}].function.parameters` };
  }
  if (choice.kind !== "required") return null;
  const call = (fn: ToolFunction): Record<string, unknown> => ({
    type: "object",
    properties: { name: { type: "string", enum: [fn.name] }, parameters: parametersOf(fn) },
    required: ["name", "parameters"],
    additionalProperties: false,
  });
  const items = functions.length === 1 ? call(functions[0] as ToolFunction) : { anyOf: functions.map(call) };
  const schema = { type: "array", items, minItems: 1, ...(parallel ? {} : { maxItems: 1 }) };
  return { spec: { kind: "json_schema", source: JSON.stringify(schema) }, param: "tools" };
}
