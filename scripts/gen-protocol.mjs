#!/usr/bin/env node
// Generates the wire message types of both languages from protocol/schema.json,
// the one definition of the protocol:
//   src/transport/messages.ts          TS interfaces, the engine/worker unions, the codec's field table
//   python/baton_worker/wire_types.py  dataclasses (with the schema's defaults), the codec's field table
// Both files are committed; test/transport/generated.test.ts fails while either is stale.
//
//   node scripts/gen-protocol.mjs           (re)write both files
//   node scripts/gen-protocol.mjs --check   write nothing; exit 1 naming each file that would change
//   --schema FILE   read another schema file;  --root DIR   write under DIR instead of the repository (tests)
//
// This is the only parser of schema.json: the codecs run from the tables it writes.

import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const repoRoot = dirname(dirname(fileURLToPath(import.meta.url)));
export const TS_OUT = "src/transport/messages.ts";
export const PY_OUT = "python/baton_worker/wire_types.py";

const SCALARS = new Set(["int", "float", "str", "bool", "any"]);
const LISTS = new Set(["i32[]", "f32[]", "u8[]", "int[]", "str[]"]);
const NUMERIC_ARRAYS = { "i32[]": ["Int32Array", "np.int32"], "f32[]": ["Float32Array", "np.float32"], "u8[]": ["Uint8Array", "np.uint8"] };
const DIRECTIONS = { engine: "EngineToWorkerMessage", worker: "WorkerToEngineMessage" };
// Names the generated files define themselves, so a struct or message may not take them.
const TS_RESERVED = new Set(["ProtocolError", "PROTOCOL_VERSION", "WIRE_TABLES", "WireTables", "WireMessage", ...Object.values(DIRECTIONS)]);
const PY_RESERVED = new Set(["Any", "PROTOCOL_VERSION", "STRUCT_CLASSES", "MESSAGE_CLASSES", "STRUCT_FIELDS", "MESSAGE_SPECS"]);
const PY_KEYWORDS = new Set(
  "False None True and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield".split(
    " ",
  ),
);

export class SchemaError extends Error {}

function fail(where, problem) {
  throw new SchemaError(`${where}: ${problem}`);
}

function isRecord(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** "i32[]?" -> {kind: "i32[]", nullable: true, text}; struct references carry the struct's name. */
function parseType(text, structNames, where) {
  const nullable = text.endsWith("?");
  const base = nullable ? text.slice(0, -1) : text;
  if (SCALARS.has(base) || LISTS.has(base)) return { kind: base, nullable, text };
  if (base.endsWith("[]") && structNames.has(base.slice(0, -2))) return { kind: "struct[]", struct: base.slice(0, -2), nullable, text };
  if (structNames.has(base)) return { kind: "struct", struct: base, nullable, text };
  return fail(where, `unknown type ${JSON.stringify(text)}`);
}

function parseFields(raw, structNames, where) {
  if (!Array.isArray(raw)) fail(where, "fields must be a list of [name, type] pairs");
  const seen = new Set();
  return raw.map((entry, i) => {
    if (!Array.isArray(entry) || entry.length !== 2 || typeof entry[0] !== "string" || typeof entry[1] !== "string") {
      fail(`${where}[${i}]`, "expected [name, type]");
    }
    const [name, type] = entry;
    if (!/^[a-z_][a-z0-9_]*$/.test(name) || PY_KEYWORDS.has(name)) fail(`${where}.${name}`, "a field name must be a lower_snake_case identifier and no Python keyword");
    if (name === "kind") fail(`${where}.${name}`, "kind is reserved (it tells TS messages apart)");
    if (seen.has(name)) fail(where, `duplicate field ${name}`);
    seen.add(name);
    return { name, type: parseType(type, structNames, `${where}.${name}`) };
  });
}

function checkTypeName(name, where) {
  if (!/^[A-Z][A-Za-z0-9]*$/.test(name)) fail(where, "a struct or message name must be a CamelCase identifier");
}

// A struct that contains itself would make the codecs recurse forever.
function checkNoStructCycles(structs) {
  const visit = (name, stack) => {
    if (stack.includes(name)) fail(`structs.${name}`, `recursive struct ${[...stack, name].join(" -> ")}`);
    for (const field of structs[name] ?? []) {
      if (field.type.kind === "struct" || field.type.kind === "struct[]") visit(field.type.struct, [...stack, name]);
    }
  };
  for (const name of Object.keys(structs)) visit(name, []);
}

/** Whether a JSON default value is a valid value of a wire type (what the codec would accept). */
function fitsType(value, type) {
  if (value === null) return type.nullable || type.kind === "any";
  const isInt = (x) => typeof x === "number" && Number.isInteger(x);
  const listOf = (ok) => Array.isArray(value) && value.every(ok);
  switch (type.kind) {
    case "int":
      return isInt(value);
    case "float":
      return typeof value === "number";
    case "str":
      return typeof value === "string";
    case "bool":
      return typeof value === "boolean";
    case "any":
      return true;
    case "i32[]":
      return listOf((x) => isInt(x) && x >= -(2 ** 31) && x < 2 ** 31);
    case "u8[]":
      return listOf((x) => isInt(x) && x >= 0 && x < 256);
    case "f32[]":
      return listOf((x) => typeof x === "number" && Math.fround(x) === x);
    case "int[]":
      return listOf(isInt);
    case "str[]":
      return listOf((x) => typeof x === "string");
    case "struct[]":
      return Array.isArray(value) && value.length === 0;
    default:
      return false;
  }
}

function parseDefaults(raw, fieldsByName) {
  if (raw === undefined) return {};
  if (!isRecord(raw)) fail("defaults", "expected an object of {Struct or Message: {field: value}}");
  const defaults = {};
  for (const [owner, values] of Object.entries(raw)) {
    const where = `defaults.${owner}`;
    const fields = fieldsByName.get(owner);
    if (fields === undefined) fail(where, "no struct or message of that name");
    if (!isRecord(values)) fail(where, "expected an object of {field: value}");
    for (const [name, value] of Object.entries(values)) {
      const field = fields.find((f) => f.name === name);
      if (field === undefined) fail(`${where}.${name}`, `${owner} has no such field`);
      // A struct's default is nil (when nullable); a struct list's is nil or empty.
      const emptyList = field.type.kind === "struct[]" && Array.isArray(value) && value.length === 0;
      const isStruct = field.type.kind === "struct" || field.type.kind === "struct[]";
      if (isStruct && value !== null && !emptyList) fail(`${where}.${name}`, "a struct field's only default is nil (when it is nullable), a struct list's nil or []");
      if (!fitsType(value, field.type)) fail(`${where}.${name}`, `${JSON.stringify(value)} is not a ${field.type.text}`);
    }
    // Python dataclasses (and callers that pass fields by position) need the defaulted fields last.
    const first = fields.findIndex((f) => f.name in values);
    const missing = fields.slice(first).find((f) => !(f.name in values));
    if (missing !== undefined) fail(`${where}.${missing.name}`, "needs a default: every field after the first defaulted one must have one");
    defaults[owner] = values;
  }
  return defaults;
}

/**
 * Parses and validates a schema document. Returns the codec's tables (the
 * WireTables of src/transport/wire-tables.ts: field types parsed, in wire order),
 * plus the defaults and semantics notes the generated files carry.
 */
export function parseSchemaDocument(doc) {
  if (!isRecord(doc)) fail("top level", "expected an object");
  const version = doc.protocol_version;
  if (typeof version !== "number" || !Number.isInteger(version)) fail("protocol_version", "expected an int");
  if (!isRecord(doc.structs)) fail("structs", "expected an object");
  if (!isRecord(doc.messages)) fail("messages", "expected an object");

  const structNames = new Set(Object.keys(doc.structs));
  const structs = {};
  for (const [name, raw] of Object.entries(doc.structs)) {
    checkTypeName(name, `structs.${name}`);
    structs[name] = parseFields(raw, structNames, `structs.${name}`);
  }
  checkNoStructCycles(structs);

  const messages = {};
  const tags = new Set();
  const tsNames = new Set(structNames);
  const pyNames = new Set(structNames);
  for (const [name, raw] of Object.entries(doc.messages)) {
    const where = `messages.${name}`;
    checkTypeName(name, where);
    if (!isRecord(raw)) fail(where, "expected an object");
    if (typeof raw.tag !== "string" || raw.tag === "") fail(`${where}.tag`, "expected a non-empty string");
    if (raw.from !== "engine" && raw.from !== "worker") fail(`${where}.from`, 'expected "engine" or "worker"');
    if (tags.has(raw.tag)) fail(`${where}.tag`, `duplicate tag ${raw.tag}`);
    tags.add(raw.tag);
    if (pyNames.has(name)) fail(where, `${name} is also a struct`);
    if (tsNames.has(`${name}Message`)) fail(where, `its TS name ${name}Message is taken`);
    pyNames.add(name);
    tsNames.add(`${name}Message`);
    messages[name] = { tag: raw.tag, from: raw.from, fields: parseFields(raw.fields, structNames, `${where}.fields`) };
  }
  for (const name of tsNames) if (TS_RESERVED.has(name)) fail(name, "the name is taken by the generated TS module");
  for (const name of pyNames) if (PY_RESERVED.has(name)) fail(name, "the name is taken by the generated Python module");

  const fieldsByName = new Map([...Object.entries(structs), ...Object.entries(messages).map(([n, m]) => [n, m.fields])]);
  const defaults = parseDefaults(doc.defaults, fieldsByName);
  const semantics = isRecord(doc.semantics) ? doc.semantics : {};
  return { tables: { protocolVersion: version, structs, messages }, defaults, semantics };
}

// ---- TypeScript ---------------------------------------------------------------

function tsType(type) {
  const base = {
    int: "number",
    float: "number",
    str: "string",
    bool: "boolean",
    any: "unknown",
    "i32[]": "Int32Array",
    "f32[]": "Float32Array",
    "u8[]": "Uint8Array",
    "int[]": "number[]",
    "str[]": "string[]",
    struct: type.struct,
    "struct[]": `${type.struct}[]`,
  }[type.kind];
  // unknown already includes null.
  return type.nullable && type.kind !== "any" ? `${base} | null` : base;
}

function jsDoc(lines, indent = "") {
  if (!Array.isArray(lines) || lines.length === 0) return "";
  return `${indent}/**\n${lines.map((line) => `${indent} * ${line}`).join("\n")}\n${indent} */\n`;
}

function tsField(field) {
  const type = field.type.struct === undefined ? "" : `, struct: ${JSON.stringify(field.type.struct)}`;
  return `{ name: ${JSON.stringify(field.name)}, type: { kind: ${JSON.stringify(field.type.kind)}${type}, nullable: ${field.type.nullable}, text: ${JSON.stringify(field.type.text)} } }`;
}

function tsFieldList(fields, indent) {
  if (fields.length === 0) return "[]";
  return `[\n${fields.map((f) => `${indent}  ${tsField(f)},`).join("\n")}\n${indent}]`;
}

export function generateTypeScript({ tables, semantics }) {
  const out = [
    "// Generated from protocol/schema.json by scripts/gen-protocol.mjs — do not edit.",
    "// Change the schema and run `node scripts/gen-protocol.mjs` (npm run build does);",
    "// test/transport/generated.test.ts fails while this file is stale.",
    "",
    'import type { WireTables } from "./wire-tables.js";',
    "",
    'export { ProtocolError } from "./protocol-error.js";',
    "",
    `export const PROTOCOL_VERSION = ${tables.protocolVersion};`,
    "",
  ];
  for (const [name, fields] of Object.entries(tables.structs)) {
    out.push(`${jsDoc(semantics[name])}export interface ${name} {`);
    for (const f of fields) out.push(`  ${f.name}: ${tsType(f.type)};`);
    out.push("}", "");
  }
  for (const [name, message] of Object.entries(tables.messages)) {
    out.push(`${jsDoc(semantics[name])}export interface ${name}Message {`, `  kind: ${JSON.stringify(name)};`);
    for (const f of message.fields) out.push(`  ${f.name}: ${tsType(f.type)};`);
    out.push("}", "");
  }
  for (const [from, union] of Object.entries(DIRECTIONS)) {
    const members = Object.entries(tables.messages)
      .filter(([, m]) => m.from === from)
      .map(([n]) => `${n}Message`);
    out.push(`/** Messages the ${from} sends. */`, `export type ${union} = ${members.length === 0 ? "never" : members.join(" | ")};`);
  }
  out.push(`export type WireMessage = ${Object.values(DIRECTIONS).join(" | ")};`, "");
  out.push("/** Every struct and message in wire order, for the codec (src/transport/codec.ts). */");
  out.push("export const WIRE_TABLES: WireTables = {", `  protocolVersion: ${tables.protocolVersion},`, "  structs: {");
  for (const [name, fields] of Object.entries(tables.structs)) out.push(`    ${name}: ${tsFieldList(fields, "    ")},`);
  out.push("  },", "  messages: {");
  for (const [name, m] of Object.entries(tables.messages)) {
    out.push(`    ${name}: {`, `      tag: ${JSON.stringify(m.tag)},`, `      from: ${JSON.stringify(m.from)},`, `      fields: ${tsFieldList(m.fields, "      ")},`, "    },");
  }
  out.push("  },", "};", "");
  return out.join("\n");
}

// ---- Python -------------------------------------------------------------------

function pyType(type) {
  const base = {
    int: "int",
    float: "float",
    str: "str",
    bool: "bool",
    any: "Any",
    "i32[]": "np.ndarray",
    "f32[]": "np.ndarray",
    "u8[]": "np.ndarray",
    "int[]": "list[int]",
    "str[]": "list[str]",
    struct: type.struct,
    "struct[]": `list[${type.struct}]`,
  }[type.kind];
  return type.nullable && type.kind !== "any" ? `${base} | None` : base;
}

/** A JSON value as a Python literal. */
function pyLiteral(value) {
  if (value === null) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : pyFloat(value);
  if (typeof value === "string") return JSON.stringify(value); // JSON string escapes are valid Python
  if (Array.isArray(value)) return `[${value.map(pyLiteral).join(", ")}]`;
  return `{${Object.entries(value)
    .map(([k, v]) => `${JSON.stringify(k)}: ${pyLiteral(v)}`)
    .join(", ")}}`;
}

// JSON has no float/int distinction (1.0 parses as 1), so a float field's default is written as a float here.
function pyFloat(value) {
  if (Number.isInteger(value) && Math.abs(value) < 1e16) return value.toFixed(1);
  return String(value);
}

function pyDefault(value, type) {
  if (value === null) return "None";
  if (type.kind in NUMERIC_ARRAYS) {
    const dtype = NUMERIC_ARRAYS[type.kind][1];
    const array = value.length === 0 ? `np.zeros(0, ${dtype})` : `np.array(${pyLiteral(value)}, ${dtype})`;
    return `dataclasses.field(default_factory=lambda: ${array})`;
  }
  if (Array.isArray(value) || isRecord(value)) return `dataclasses.field(default_factory=lambda: ${pyLiteral(value)})`;
  return type.kind === "float" ? pyFloat(value) : pyLiteral(value);
}

function pyClass(name, fields, defaults, notes) {
  const lines = ["", "", "@dataclass", `class ${name}:`];
  if (Array.isArray(notes) && notes.length > 0) lines.push(`    """${notes.join("\n\n    ").replaceAll("\\", "\\\\").replaceAll('"""', '\\"\\"\\"')}"""`, "");
  if (fields.length === 0 && lines.at(-1) === `class ${name}:`) lines.push("    pass");
  for (const f of fields) {
    const value = defaults?.[f.name];
    lines.push(`    ${f.name}: ${pyType(f.type)}${value === undefined ? "" : ` = ${pyDefault(value, f.type)}`}`);
  }
  return lines;
}

function pyFieldTuple(f) {
  return `(${JSON.stringify(f.name)}, ${JSON.stringify(f.type.kind)}, ${f.type.nullable ? "True" : "False"}, ${f.type.struct === undefined ? "None" : JSON.stringify(f.type.struct)})`;
}

function pyFieldList(fields, indent) {
  if (fields.length === 0) return "()";
  return `(\n${fields.map((f) => `${indent}    ${pyFieldTuple(f)},`).join("\n")}\n${indent})`;
}

export function generatePython({ tables, defaults, semantics }) {
  const structNames = Object.keys(tables.structs);
  const messageNames = Object.keys(tables.messages);
  const out = [
    '"""Generated from protocol/schema.json by scripts/gen-protocol.mjs — do not edit.',
    "",
    "The wire's structs and messages as dataclasses (field order is wire order,",
    "defaults from the schema's \"defaults\"), and the field tables baton_worker.protocol",
    "runs its codec from. Import these through baton_worker.protocol.",
    '"""',
    "",
    "from __future__ import annotations",
    "",
    "import dataclasses",
    "from dataclasses import dataclass",
    "from typing import Any",
    "",
    "import numpy as np",
    "",
    `__all__ = ${pyLiteral(["PROTOCOL_VERSION", ...structNames, ...messageNames, "STRUCT_CLASSES", "MESSAGE_CLASSES"])}`,
    "",
    `PROTOCOL_VERSION = ${tables.protocolVersion}`,
  ];
  for (const [name, fields] of Object.entries(tables.structs)) out.push(...pyClass(name, fields, defaults[name], semantics[name]));
  for (const [name, m] of Object.entries(tables.messages)) out.push(...pyClass(name, m.fields, defaults[name], semantics[name]));
  out.push(
    "",
    "",
    `STRUCT_CLASSES: dict[str, type] = {${structNames.map((n) => `${JSON.stringify(n)}: ${n}`).join(", ")}}`,
    `MESSAGE_CLASSES: dict[str, type] = {${messageNames.map((n) => `${JSON.stringify(n)}: ${n}`).join(", ")}}`,
    "",
    "# Wire layout, in field order: (name, type, nullable, struct name or None).",
    "FieldSpec = tuple[str, str, bool, str | None]",
    "STRUCT_FIELDS: dict[str, tuple[FieldSpec, ...]] = {",
  );
  for (const [name, fields] of Object.entries(tables.structs)) out.push(`    ${JSON.stringify(name)}: ${pyFieldList(fields, "    ")},`);
  out.push("}", "# name -> (tag, sender, fields)", "MESSAGE_SPECS: dict[str, tuple[str, str, tuple[FieldSpec, ...]]] = {");
  for (const [name, m] of Object.entries(tables.messages)) {
    out.push(`    ${JSON.stringify(name)}: (`, `        ${JSON.stringify(m.tag)},`, `        ${JSON.stringify(m.from)},`, `        ${pyFieldList(m.fields, "        ")},`, "    ),");
  }
  out.push("}", "");
  return out.join("\n");
}

// ---- command line ---------------------------------------------------------------

function optionValue(args, name) {
  const i = args.indexOf(name);
  if (i < 0) return undefined;
  const value = args[i + 1];
  if (value === undefined) throw new SchemaError(`${name} needs a value`);
  return value;
}

/** Generates (or, with check, compares) both files; returns the relative paths that are or were stale. */
export function run({ schemaPath, root, check }) {
  const parsed = parseSchemaDocument(JSON.parse(readFileSync(schemaPath, "utf8")));
  const files = { [TS_OUT]: generateTypeScript(parsed), [PY_OUT]: generatePython(parsed) };
  const stale = [];
  for (const [relative, text] of Object.entries(files)) {
    const path = join(root, relative);
    if (existsSync(path) && readFileSync(path, "utf8") === text) continue;
    stale.push(relative);
    if (!check) {
      mkdirSync(dirname(path), { recursive: true });
      writeFileSync(path, text);
    }
  }
  return stale;
}

function main(args) {
  const check = args.includes("--check");
  const schemaPath = resolve(optionValue(args, "--schema") ?? join(repoRoot, "protocol", "schema.json"));
  const root = resolve(optionValue(args, "--root") ?? repoRoot);
  let stale;
  try {
    stale = run({ schemaPath, root, check });
  } catch (error) {
    // A SchemaError names the place in the schema; anything else (unreadable file, bad JSON) names the file.
    console.error(`gen-protocol: ${schemaPath}: ${error.message}`);
    return 2;
  }
  if (check) {
    for (const relative of stale) console.error(`gen-protocol: ${relative} is stale; run node scripts/gen-protocol.mjs`);
    return stale.length > 0 ? 1 : 0;
  }
  for (const relative of stale) console.log(`gen-protocol: wrote ${relative}`);
  return 0;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  process.exitCode = main(process.argv.slice(2));
}
