// A typed, validated view of protocol/schema.json, the single source of truth
// for the wire format. The codec is built from this at run time, so field
// order lives in exactly one place.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { packageRoot } from "./package-root.js";

export const schemaPath: string = join(packageRoot, "protocol", "schema.json");

/** A parsed schema type such as "i32[]?", "AddedRequest[]" or "int". */
export type WireType =
  | { kind: "int" | "float" | "str" | "bool"; nullable: boolean; text: string }
  | { kind: "i32[]" | "f32[]" | "u8[]" | "int[]"; nullable: boolean; text: string }
  | { kind: "struct"; struct: string; nullable: boolean; text: string }
  | { kind: "struct[]"; struct: string; nullable: boolean; text: string };

export interface SchemaField {
  name: string;
  type: WireType;
}

export interface SchemaMessage {
  name: string;
  tag: string;
  from: "engine" | "worker";
  fields: SchemaField[];
}

export interface Schema {
  protocolVersion: number;
  structs: ReadonlyMap<string, SchemaField[]>;
  /** By message name (StepMessage.kind), in file order. */
  messages: ReadonlyMap<string, SchemaMessage>;
  /** By wire tag ("step", "result", ...). */
  byTag: ReadonlyMap<string, SchemaMessage>;
}

const SCALARS = new Set(["int", "float", "str", "bool"]);
const ARRAYS = new Set(["i32[]", "f32[]", "u8[]", "int[]"]);

function fail(where: string, problem: string): never {
  throw new Error(`${schemaPath}: ${where}: ${problem}`);
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function parseWireType(text: string, structNames: ReadonlySet<string>, where: string): WireType {
  const nullable = text.endsWith("?");
  const base = nullable ? text.slice(0, -1) : text;
  if (SCALARS.has(base)) return { kind: base as "int" | "float" | "str" | "bool", nullable, text };
  if (ARRAYS.has(base)) return { kind: base as "i32[]" | "f32[]" | "u8[]" | "int[]", nullable, text };
  if (base.endsWith("[]") && structNames.has(base.slice(0, -2))) {
    return { kind: "struct[]", struct: base.slice(0, -2), nullable, text };
  }
  if (structNames.has(base)) return { kind: "struct", struct: base, nullable, text };
  return fail(where, `unknown type ${JSON.stringify(text)}`);
}

function parseFields(raw: unknown, structNames: ReadonlySet<string>, where: string): SchemaField[] {
  if (!Array.isArray(raw)) fail(where, "fields must be a list of [name, type] pairs");
  const seen = new Set<string>();
  return raw.map((entry: unknown, i) => {
    if (!Array.isArray(entry) || entry.length !== 2 || typeof entry[0] !== "string" || typeof entry[1] !== "string") {
      fail(`${where}[${i}]`, "expected [name, type]");
    }
    const [name, type] = entry as [string, string];
    if (seen.has(name)) fail(where, `duplicate field ${name}`);
    seen.add(name);
    return { name, type: parseWireType(type, structNames, `${where}.${name}`) };
  });
}

/** Parses and validates a schema document (the contents of schema.json). */
export function parseSchema(doc: unknown): Schema {
  if (!isRecord(doc)) fail("top level", "expected an object");
  const version = doc.protocol_version;
  if (typeof version !== "number" || !Number.isInteger(version)) fail("protocol_version", "expected an int");
  if (!isRecord(doc.structs)) fail("structs", "expected an object");
  if (!isRecord(doc.messages)) fail("messages", "expected an object");

  const structNames = new Set(Object.keys(doc.structs));
  const structs = new Map<string, SchemaField[]>();
  for (const [name, raw] of Object.entries(doc.structs)) {
    structs.set(name, parseFields(raw, structNames, `structs.${name}`));
  }
  checkNoStructCycles(structs);

  const messages = new Map<string, SchemaMessage>();
  const byTag = new Map<string, SchemaMessage>();
  for (const [name, raw] of Object.entries(doc.messages)) {
    const where = `messages.${name}`;
    if (!isRecord(raw)) fail(where, "expected an object");
    if (typeof raw.tag !== "string" || raw.tag === "") fail(`${where}.tag`, "expected a non-empty string");
    if (raw.from !== "engine" && raw.from !== "worker") fail(`${where}.from`, 'expected "engine" or "worker"');
    if (byTag.has(raw.tag)) fail(`${where}.tag`, `duplicate tag ${raw.tag}`);
    const message: SchemaMessage = {
      name,
      tag: raw.tag,
      from: raw.from,
      fields: parseFields(raw.fields, structNames, `${where}.fields`),
    };
    messages.set(name, message);
    byTag.set(message.tag, message);
  }
  return { protocolVersion: version, structs, messages, byTag };
}

// A struct that contains itself would make the codec recurse forever.
function checkNoStructCycles(structs: ReadonlyMap<string, SchemaField[]>): void {
  const visit = (name: string, stack: string[]): void => {
    if (stack.includes(name)) fail(`structs.${name}`, `recursive struct ${[...stack, name].join(" -> ")}`);
    for (const field of structs.get(name) ?? []) {
      if (field.type.kind === "struct" || field.type.kind === "struct[]") visit(field.type.struct, [...stack, name]);
    }
  };
  for (const name of structs.keys()) visit(name, []);
}

let cached: Schema | undefined;

/** The schema from protocol/schema.json, parsed once. */
export function loadSchema(): Schema {
  if (cached === undefined) {
    let text: string;
    try {
      text = readFileSync(schemaPath, "utf8");
    } catch (error) {
      throw new Error(`cannot read the wire schema ${schemaPath}: ${(error as Error).message}`);
    }
    cached = parseSchema(JSON.parse(text) as unknown);
  }
  return cached;
}
