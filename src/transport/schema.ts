// The wire schema as the codec uses it. protocol/schema.json is the one
// definition; scripts/gen-protocol.mjs parses it and writes its tables into
// messages.ts (WIRE_TABLES), next to the message types, so the types and the
// codec cannot disagree.

import { join } from "node:path";
import { WIRE_TABLES } from "./messages.js";
import { packageRoot } from "./package-root.js";
import type { SchemaField, WireTables, WireType } from "./wire-tables.js";

export const schemaPath: string = join(packageRoot, "protocol", "schema.json");

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

export function schemaFromTables(tables: WireTables): Schema {
  const messages = new Map<string, SchemaMessage>();
  const byTag = new Map<string, SchemaMessage>();
  for (const [name, spec] of Object.entries(tables.messages)) {
    const message = { name, ...spec };
    messages.set(name, message);
    byTag.set(spec.tag, message);
  }
  return { protocolVersion: tables.protocolVersion, structs: new Map(Object.entries(tables.structs)), messages, byTag };
}

let cached: Schema | undefined;

/** The schema of protocol/schema.json, from the generated tables. */
export function loadSchema(): Schema {
  cached ??= schemaFromTables(WIRE_TABLES);
  return cached;
}
