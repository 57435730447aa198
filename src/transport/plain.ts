// The JSON form of wire messages used by protocol/golden/*.json:
// {"message": "Step", "value": {...fields}} with numeric arrays as plain number
// lists and nil as null. Driven by the schema like the codec, so the golden
// files need no per-message code in either language.

import { ProtocolError, type WireMessage } from "./messages.js";
import { loadSchema, type Schema } from "./schema.js";
import type { SchemaField, WireType } from "./wire-tables.js";

export interface GoldenDocument {
  message: string;
  value: Record<string, unknown>;
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

function plainValue(schema: Schema, type: WireType, value: unknown, path: string): Json {
  if (value === null) {
    if (!type.nullable) throw new ProtocolError(`${path}: nil in a non-nullable ${type.text} field`, path);
    return null;
  }
  switch (type.kind) {
    case "int":
    case "float":
    case "str":
    case "bool":
      return value as Json;
    case "i32[]":
    case "f32[]":
    case "u8[]":
      return Array.from(value as ArrayLike<number>);
    case "int[]":
      return [...(value as number[])];
    case "str[]":
      return [...(value as string[])];
    case "any":
      // JSON-shaped any values only (bin inside an any has no JSON form).
      return value as Json;
    case "struct":
      return plainFields(schema, schema.structs.get(type.struct) ?? [], value as Record<string, unknown>, path);
    case "struct[]":
      return (value as Record<string, unknown>[]).map((item, i) =>
        plainFields(schema, schema.structs.get(type.struct) ?? [], item, `${path}[${i}]`),
      );
  }
}

function plainFields(schema: Schema, fields: readonly SchemaField[], obj: Record<string, unknown>, path: string): { [key: string]: Json } {
  const out: { [key: string]: Json } = {};
  for (const f of fields) out[f.name] = plainValue(schema, f.type, obj[f.name], `${path}.${f.name}`);
  return out;
}

function fromPlainValue(schema: Schema, type: WireType, value: unknown, path: string): unknown {
  if (value === null) {
    if (!type.nullable) throw new ProtocolError(`${path}: null in a non-nullable ${type.text} field`, path);
    return null;
  }
  const numbers = (): number[] => {
    if (!Array.isArray(value) || !value.every((x) => typeof x === "number")) throw new ProtocolError(`${path}: expected a list of numbers`, path);
    return value as number[];
  };
  switch (type.kind) {
    case "int":
    case "float":
    case "str":
    case "bool":
      return value;
    case "i32[]":
      return Int32Array.from(numbers());
    case "f32[]":
      return Float32Array.from(numbers());
    case "u8[]":
      return Uint8Array.from(numbers());
    case "int[]":
      return [...numbers()];
    case "str[]":
      if (!Array.isArray(value) || !value.every((x) => typeof x === "string")) throw new ProtocolError(`${path}: expected a list of strings`, path);
      return [...(value as string[])];
    case "any":
      return value;
    case "struct":
      return fromPlainFields(schema, schema.structs.get(type.struct) ?? [], value, path);
    case "struct[]":
      if (!Array.isArray(value)) throw new ProtocolError(`${path}: expected a list`, path);
      return value.map((item: unknown, i) => fromPlainFields(schema, schema.structs.get(type.struct) ?? [], item, `${path}[${i}]`));
  }
}

function fromPlainFields(schema: Schema, fields: readonly SchemaField[], value: unknown, path: string): Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new ProtocolError(`${path}: expected an object`, path);
  const obj = value as Record<string, unknown>;
  const out: Record<string, unknown> = {};
  for (const f of fields) {
    if (!(f.name in obj)) throw new ProtocolError(`${path}.${f.name}: missing`, `${path}.${f.name}`);
    out[f.name] = fromPlainValue(schema, f.type, obj[f.name], `${path}.${f.name}`);
  }
  const extra = Object.keys(obj).filter((k) => !fields.some((f) => f.name === k));
  if (extra.length > 0) throw new ProtocolError(`${path}: unknown fields ${extra.join(", ")}`, path);
  return out;
}

/** A message as its golden JSON document. */
export function toPlain(message: WireMessage, schema: Schema = loadSchema()): GoldenDocument {
  const spec = schema.messages.get(message.kind);
  if (spec === undefined) throw new ProtocolError(`kind: unknown message kind ${message.kind}`, "kind");
  return { message: message.kind, value: plainFields(schema, spec.fields, message as unknown as Record<string, unknown>, message.kind) };
}

/** A golden JSON document as a message with typed arrays. */
export function fromPlain(doc: GoldenDocument, schema: Schema = loadSchema()): WireMessage {
  const spec = schema.messages.get(doc.message);
  if (spec === undefined) throw new ProtocolError(`message: unknown message ${doc.message}`, "message");
  return { kind: doc.message, ...fromPlainFields(schema, spec.fields, doc.value, doc.message) } as unknown as WireMessage;
}
