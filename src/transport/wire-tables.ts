// The schema's tables as plain data: what scripts/gen-protocol.mjs writes into
// messages.ts (WIRE_TABLES) and what schema.ts builds the codec's view from.

/** A parsed schema type such as "i32[]?", "AddedRequest[]" or "int". */
export type WireType =
  | { kind: "int" | "float" | "str" | "bool" | "any"; nullable: boolean; text: string }
  | { kind: "i32[]" | "f32[]" | "u8[]" | "int[]" | "str[]"; nullable: boolean; text: string }
  | { kind: "struct" | "struct[]"; struct: string; nullable: boolean; text: string };

export interface SchemaField {
  name: string;
  type: WireType;
}

/** The schema as gen-protocol writes it: plain data, structs and messages in file order. */
export interface WireTables {
  protocolVersion: number;
  structs: Record<string, SchemaField[]>;
  messages: Record<string, { tag: string; from: "engine" | "worker"; fields: SchemaField[] }>;
}
