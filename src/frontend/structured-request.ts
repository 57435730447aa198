// The request fields that ask for structured output, in every spelling
// Baton takes (chat and completions alike):
// - OpenAI's response_format: {"type": "json_object"} or {"type":
//   "json_schema", "json_schema": {"name", "schema", "strict"}} ("text": none);
// - vLLM's structured_outputs: {"json" | "regex" | "choice" | "grammar" |
//   "json_object" | "structural_tag": ...};
// - vLLM's older guided_json, guided_regex, guided_choice, guided_grammar.
// One request may use one of them. Whether the grammar compiles is checked
// later, by the grammar engine (structured-output.ts).

import type { GrammarSpec } from "../structured/grammar-spec.js";
import { badRequest } from "./openai-error.js";

export interface StructuredBody {
  response_format?: ({ type: string } & Record<string, unknown>) | null;
  structured_outputs?: unknown;
  guided_json?: unknown;
  guided_regex?: unknown;
  guided_choice?: unknown;
  guided_grammar?: unknown;
}

/** A grammar and the request parameter that gave it (errors name it). */
export interface RequestedGrammar {
  spec: GrammarSpec;
  param: string;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A JSON schema given as an object (or boolean), or as its JSON text. */
function schemaSource(value: unknown, param: string): string {
  let schema = value;
  if (typeof value === "string") {
    try {
      schema = JSON.parse(value) as unknown;
    } catch (error) {
      throw badRequest(`${param} is not valid JSON: ${(error as Error).message}`, param);
    }
  }
  if (!isObject(schema) && typeof schema !== "boolean") throw badRequest(`${param} must be a JSON schema (an object)`, param);
  return JSON.stringify(schema);
}

function textOf(value: unknown, param: string): string {
  if (typeof value !== "string" || value === "") throw badRequest(`${param} must be a non-empty string`, param);
  return value;
}

function choicesOf(value: unknown, param: string): string {
  if (!Array.isArray(value) || value.length === 0 || !value.every((c) => typeof c === "string" && c !== "")) {
    throw badRequest(`${param} must be a non-empty list of non-empty strings`, param);
  }
  return JSON.stringify(value);
}

function fromResponseFormat(format: NonNullable<StructuredBody["response_format"]>): RequestedGrammar | null {
  switch (format.type) {
    case "text":
      return null;
    case "json_object":
      return { spec: { kind: "json_object", source: "" }, param: "response_format" };
    case "json_schema": {
      const spec = format.json_schema;
      if (!isObject(spec)) throw badRequest("response_format.json_schema must be an object with name and schema", "response_format.json_schema");
      if (spec.name != null && typeof spec.name !== "string") throw badRequest("response_format.json_schema.name must be a string", "response_format.json_schema.name");
      if (spec.strict != null && typeof spec.strict !== "boolean") throw badRequest("response_format.json_schema.strict must be a boolean", "response_format.json_schema.strict");
      if (spec.schema == null) throw badRequest("response_format.json_schema.schema is required", "response_format.json_schema.schema");
      const param = "response_format.json_schema.schema";
      return { spec: { kind: "json_schema", source: schemaSource(spec.schema, param) }, param };
    }
    default:
      throw badRequest(`response_format type ${JSON.stringify(format.type)} is not supported (text, json_object, json_schema)`, "response_format.type");
  }
}

const STRUCTURED_KEYS = ["json", "regex", "choice", "grammar", "json_object", "structural_tag"] as const;

function fromStructuredOutputs(value: unknown): RequestedGrammar | null {
  if (!isObject(value)) throw badRequest("structured_outputs must be an object", "structured_outputs");
  const given = STRUCTURED_KEYS.filter((key) => value[key] != null && value[key] !== false);
  if (given.length > 1) throw badRequest(`structured_outputs takes one of ${STRUCTURED_KEYS.join(", ")}; got ${given.join(" and ")}`, "structured_outputs");
  const key = given[0];
  if (key === undefined) return null;
  const param = `structured_outputs.${key}`;
  const raw = value[key];
  switch (key) {
    case "json":
      return { spec: { kind: "json_schema", source: schemaSource(raw, param) }, param };
    case "regex":
      return { spec: { kind: "regex", source: textOf(raw, param) }, param };
    case "choice":
      return { spec: { kind: "choice", source: choicesOf(raw, param) }, param };
    case "grammar":
      return { spec: { kind: "ebnf", source: textOf(raw, param) }, param };
    case "json_object":
      if (raw !== true) throw badRequest(`${param} must be true`, param);
      return { spec: { kind: "json_object", source: "" }, param };
    case "structural_tag":
      return { spec: { kind: "structural_tag", source: typeof raw === "string" ? textOf(raw, param) : JSON.stringify(raw) }, param };
  }
}

/** The structured output a request asks for, or null. */
export function parseStructuredOutput(body: StructuredBody): RequestedGrammar | null {
  const found: RequestedGrammar[] = [];
  const names: string[] = [];
  const add = (name: string, grammar: RequestedGrammar | null): void => {
    if (grammar === null) return;
    found.push(grammar);
    names.push(name);
  };
  if (body.response_format != null) add("response_format", fromResponseFormat(body.response_format));
  if (body.structured_outputs != null) add("structured_outputs", fromStructuredOutputs(body.structured_outputs));
  if (body.guided_json != null) add("guided_json", { spec: { kind: "json_schema", source: schemaSource(body.guided_json, "guided_json") }, param: "guided_json" });
  if (body.guided_regex != null) add("guided_regex", { spec: { kind: "regex", source: textOf(body.guided_regex, "guided_regex") }, param: "guided_regex" });
  if (body.guided_choice != null) add("guided_choice", { spec: { kind: "choice", source: choicesOf(body.guided_choice, "guided_choice") }, param: "guided_choice" });
  if (body.guided_grammar != null) add("guided_grammar", { spec: { kind: "ebnf", source: textOf(body.guided_grammar, "guided_grammar") }, param: "guided_grammar" });
  if (found.length > 1) throw badRequest(`a request takes one structured output; got ${names.join(" and ")}`, names[1] ?? null);
  return found[0] ?? null;
}
