// MessagePack codec for the engine <-> worker wire format, driven by
// protocol/schema.json: a message is [tag, field_1, ...] in schema order, a
// struct is the array of its fields, i32[]/f32[]/u8[] are raw little-endian
// bytes (MessagePack bin). Decoded numeric arrays are typed-array views over
// the received buffer, copied only when the bytes are not aligned for the
// element type. Every malformed input becomes a ProtocolError naming the field.
// The field tables come from messages.ts, generated from the schema with the types.
//
// Canonical numbers: msgpackr already packs a number whose value is an integer
// in [-2^31, 2^32) as the smallest MessagePack integer and any other number as
// float64 (useFloat32 off), which is exactly the rule in schema.json "about";
// test/transport/codec.test.ts pins that byte for byte.

import { Packr } from "msgpackr";
import { endianness } from "node:os";
import { ProtocolError, type WireMessage, type EngineToWorkerMessage, type WorkerToEngineMessage } from "./messages.js";
import { loadSchema, type Schema, type SchemaMessage } from "./schema.js";
import type { SchemaField, WireType } from "./wire-tables.js";

const LITTLE_ENDIAN_HOST = endianness() === "LE";

// Plain MessagePack only: no record extension, no bundled strings, no typed-array
// extensions (typed arrays are turned into Uint8Array views before packing).
// Maps decode as Map so that an `any` value's non-string keys can be refused
// (as Python does) rather than silently turned into strings; variableMapSize
// writes the smallest map header, as Python's msgpack does (only `any` holds maps).
const packr = new Packr({
  useRecords: false,
  mapsAsObjects: false,
  variableMapSize: true,
  moreTypes: false,
  bundleStrings: false,
  structuredClone: false,
  useFloat32: 0,
  encodeUndefinedAsNil: false,
});

type Encoder = (value: unknown, path: string) => unknown;
type Decoder = (value: unknown, path: string) => unknown;

/** How a decoded value looks, for error messages: "int", "float", "string", "nil", "bin(7 bytes)", ... */
function describeValue(value: unknown): string {
  if (value === null) return "nil";
  if (value === undefined) return "undefined";
  if (typeof value === "number") return Number.isInteger(value) ? "int" : "float";
  if (typeof value === "bigint") return "int64";
  if (typeof value === "boolean") return "bool";
  if (typeof value === "string") return "string";
  if (value instanceof Uint8Array) return `bin(${value.byteLength} bytes)`;
  if (Array.isArray(value)) return `array(${value.length})`;
  if (ArrayBuffer.isView(value)) return value.constructor.name;
  if (value instanceof Date) return "timestamp";
  if (value instanceof Map) return "map";
  if (typeof value === "object") {
    const name = value.constructor?.name;
    return name === undefined || name === "Object" ? "map" : name;
  }
  return typeof value;
}

function mismatch(path: string, expected: string, value: unknown): ProtocolError {
  return new ProtocolError(`${path}: expected ${expected}, got ${describeValue(value)}`, path);
}

/** str and bool travel as themselves both ways; only the type is checked. */
function checkString(v: unknown, p: string): string {
  if (typeof v === "string") return v;
  throw mismatch(p, "string", v);
}

function checkBool(v: unknown, p: string): boolean {
  if (typeof v === "boolean") return v;
  throw mismatch(p, "bool", v);
}

// ---- numeric arrays ----------------------------------------------------------

type NumericArrayKind = "i32[]" | "f32[]" | "u8[]";
type NumericArray = Int32Array | Float32Array | Uint8Array;

const ELEMENT: Record<NumericArrayKind, { bytes: number; ctor: Int32ArrayConstructor | Float32ArrayConstructor | Uint8ArrayConstructor }> = {
  "i32[]": { bytes: 4, ctor: Int32Array },
  "f32[]": { bytes: 4, ctor: Float32Array },
  "u8[]": { bytes: 1, ctor: Uint8Array },
};

function bytesOf(array: NumericArray, kind: NumericArrayKind): Uint8Array {
  const view = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
  if (LITTLE_ENDIAN_HOST || kind === "u8[]") return view;
  // Big-endian host: the wire is little-endian, so swap into a copy.
  const out = new Uint8Array(view.byteLength);
  const dv = new DataView(array.buffer, array.byteOffset, array.byteLength);
  const ov = new DataView(out.buffer);
  for (let i = 0; i < array.length; i++) {
    if (kind === "i32[]") ov.setInt32(i * 4, dv.getInt32(i * 4, false), true);
    else ov.setFloat32(i * 4, dv.getFloat32(i * 4, false), true);
  }
  return out;
}

function arrayFromBytes(bin: Uint8Array, kind: NumericArrayKind, path: string): NumericArray {
  const { bytes, ctor } = ELEMENT[kind];
  if (bin.byteLength % bytes !== 0) {
    throw new ProtocolError(`${path}: expected ${kind} (a multiple of ${bytes} bytes), got ${bin.byteLength} bytes`, path);
  }
  const length = bin.byteLength / bytes;
  if (!LITTLE_ENDIAN_HOST && bytes > 1) {
    const out = new ctor(length);
    const dv = new DataView(bin.buffer, bin.byteOffset, bin.byteLength);
    for (let i = 0; i < length; i++) out[i] = kind === "i32[]" ? dv.getInt32(i * 4, true) : dv.getFloat32(i * 4, true);
    return out;
  }
  // Received frames are Node Buffers over plain ArrayBuffers, never shared memory.
  const buffer = bin.buffer as ArrayBuffer;
  if (bin.byteOffset % bytes === 0) return new ctor(buffer, bin.byteOffset, length);
  // Unaligned inside the received frame: one copy into fresh, aligned memory.
  return new ctor(buffer.slice(bin.byteOffset, bin.byteOffset + bin.byteLength));
}

// ---- any: plain MessagePack data passed through ----------------------------

const ANY_VALUE = "a plain MessagePack value (nil, bool, number, string, Uint8Array, array, or object)";

function isPlainObject(value: object): boolean {
  const proto: unknown = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/** Checks that msgpackr will pack `value` as plain MessagePack (no extension types) and returns it untouched. */
function checkAnyValue(value: unknown, path: string): unknown {
  if (value === null || typeof value === "boolean" || typeof value === "number" || typeof value === "string") return value;
  if (typeof value === "object") {
    if (value.constructor === Uint8Array || value instanceof Buffer) return value;
    if (Array.isArray(value)) {
      value.forEach((item: unknown, i) => checkAnyValue(item, `${path}[${i}]`));
      return value;
    }
    if (isPlainObject(value)) {
      for (const [key, item] of Object.entries(value)) checkAnyValue(item, `${path}.${key}`);
      return value;
    }
  }
  throw mismatch(path, ANY_VALUE, value);
}

/** The decoded `any` value: maps become plain objects, bin a Uint8Array view, 64-bit ints numbers. */
function anyFromWire(value: unknown, path: string): unknown {
  if (value === null || typeof value === "boolean" || typeof value === "number" || typeof value === "string") return value;
  if (typeof value === "bigint") return toInt(value, path);
  if (value instanceof Uint8Array) return value instanceof Buffer ? new Uint8Array(value.buffer, value.byteOffset, value.byteLength) : value;
  if (Array.isArray(value)) return value.map((item: unknown, i) => anyFromWire(item, `${path}[${i}]`));
  if (value instanceof Map) {
    const out: Record<string, unknown> = {};
    for (const [key, item] of value as Map<unknown, unknown>) {
      if (typeof key !== "string") throw new ProtocolError(`${path}: expected map keys to be strings, got ${describeValue(key)}`, path);
      // defineProperty: a "__proto__" key stays an ordinary key.
      Object.defineProperty(out, key, { value: anyFromWire(item, `${path}.${key}`), enumerable: true, writable: true, configurable: true });
    }
    return out;
  }
  throw mismatch(path, "a plain MessagePack value", value);
}

// ---- per-type encoders and decoders, built once from the schema -------------

function toInt(value: unknown, path: string): number {
  if (typeof value === "number" && Number.isInteger(value)) return value;
  if (typeof value === "bigint") {
    if (value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER)) return Number(value);
    throw new ProtocolError(`${path}: int ${value} is outside the safe integer range`, path);
  }
  throw mismatch(path, "int", value);
}

function toFloat(value: unknown, path: string): number {
  if (typeof value === "number") return value;
  if (typeof value === "bigint") return Number(value);
  throw mismatch(path, "float", value);
}

class CodecBuilder {
  private readonly encoders = new Map<string, Encoder>();
  private readonly decoders = new Map<string, Decoder>();

  constructor(private readonly schema: Schema) {}

  encoder(type: WireType): Encoder {
    let fn = this.encoders.get(type.text);
    if (fn === undefined) {
      const base = this.baseEncoder(type);
      fn = type.nullable ? (v, p) => (v === null ? null : base(v, p)) : base;
      this.encoders.set(type.text, fn);
    }
    return fn;
  }

  decoder(type: WireType): Decoder {
    let fn = this.decoders.get(type.text);
    if (fn === undefined) {
      const base = this.baseDecoder(type);
      fn = type.nullable ? (v, p) => (v === null ? null : base(v, p)) : base;
      this.decoders.set(type.text, fn);
    }
    return fn;
  }

  fieldsEncoder(fields: readonly SchemaField[]): (obj: Record<string, unknown>, path: string, out: unknown[]) => void {
    const parts = fields.map((f) => ({ name: f.name, enc: this.encoder(f.type) }));
    return (obj, path, out) => {
      for (const { name, enc } of parts) {
        const fieldPath = `${path}.${name}`;
        if (!(name in obj)) throw new ProtocolError(`${fieldPath}: missing`, fieldPath);
        out.push(enc(obj[name], fieldPath));
      }
    };
  }

  fieldsDecoder(fields: readonly SchemaField[]): (values: readonly unknown[], offset: number, path: string, out: Record<string, unknown>) => void {
    const parts = fields.map((f) => ({ name: f.name, dec: this.decoder(f.type) }));
    return (values, offset, path, out) => {
      for (let i = 0; i < parts.length; i++) {
        const { name, dec } = parts[i]!;
        out[name] = dec(values[offset + i], `${path}.${name}`);
      }
    };
  }

  private structFields(name: string): SchemaField[] {
    const fields = this.schema.structs.get(name);
    if (fields === undefined) throw new Error(`schema has no struct ${name}`);
    return fields;
  }

  private baseEncoder(type: WireType): Encoder {
    switch (type.kind) {
      case "int":
        return (v, p) => {
          if (typeof v === "number" && Number.isInteger(v)) return v;
          throw mismatch(p, "int", v);
        };
      case "float":
        return (v, p) => {
          if (typeof v === "number") return v;
          throw mismatch(p, "float", v);
        };
      case "str":
        return checkString;
      case "bool":
        return checkBool;
      case "i32[]":
      case "f32[]":
      case "u8[]": {
        const kind = type.kind;
        const ctor = ELEMENT[kind].ctor;
        return (v, p) => {
          // Buffer is a Uint8Array subclass; accept it for u8[].
          if (v instanceof ctor) return bytesOf(v as NumericArray, kind);
          throw mismatch(p, ctor.name, v);
        };
      }
      case "int[]":
        return (v, p) => {
          if (!Array.isArray(v)) throw mismatch(p, "array of int", v);
          v.forEach((x, i) => {
            if (typeof x !== "number" || !Number.isInteger(x)) throw mismatch(`${p}[${i}]`, "int", x);
          });
          return v;
        };
      case "str[]":
        return (v, p) => {
          if (!Array.isArray(v)) throw mismatch(p, "array of string", v);
          v.forEach((x, i) => checkString(x, `${p}[${i}]`));
          return v;
        };
      case "any":
        return (v, p) => {
          if (v === null) throw mismatch(p, "a value (any; nil needs any?)", v);
          return checkAnyValue(v, p);
        };
      case "struct": {
        const fields = this.fieldsEncoder(this.structFields(type.struct));
        return (v, p) => {
          if (typeof v !== "object" || v === null || Array.isArray(v)) throw mismatch(p, type.struct, v);
          const out: unknown[] = [];
          fields(v as Record<string, unknown>, p, out);
          return out;
        };
      }
      case "struct[]": {
        const item = this.encoder({ kind: "struct", struct: type.struct, nullable: false, text: type.struct });
        return (v, p) => {
          if (!Array.isArray(v)) throw mismatch(p, `array of ${type.struct}`, v);
          return v.map((x: unknown, i) => item(x, `${p}[${i}]`));
        };
      }
    }
  }

  private baseDecoder(type: WireType): Decoder {
    switch (type.kind) {
      case "int":
        return toInt;
      case "float":
        return toFloat;
      case "str":
        return checkString;
      case "bool":
        return checkBool;
      case "i32[]":
      case "f32[]":
      case "u8[]": {
        const kind = type.kind;
        return (v, p) => {
          if (v instanceof Uint8Array) return arrayFromBytes(v, kind, p);
          throw mismatch(p, `${kind} (bin)`, v);
        };
      }
      case "int[]":
        return (v, p) => {
          if (!Array.isArray(v)) throw mismatch(p, "array of int", v);
          return v.map((x: unknown, i) => toInt(x, `${p}[${i}]`));
        };
      case "str[]":
        return (v, p) => {
          if (!Array.isArray(v)) throw mismatch(p, "array of string", v);
          return v.map((x: unknown, i) => checkString(x, `${p}[${i}]`));
        };
      case "any":
        return (v, p) => {
          if (v === null) throw mismatch(p, "a value (any; nil needs any?)", v);
          return anyFromWire(v, p);
        };
      case "struct": {
        const schemaFields = this.structFields(type.struct);
        const fields = this.fieldsDecoder(schemaFields);
        const n = schemaFields.length;
        return (v, p) => {
          if (!Array.isArray(v)) throw mismatch(p, `${type.struct} (array of ${n})`, v);
          if (v.length !== n) {
            throw new ProtocolError(`${p}: expected ${type.struct} with ${n} fields, got ${v.length}`, p);
          }
          const out: Record<string, unknown> = {};
          fields(v, 0, p, out);
          return out;
        };
      }
      case "struct[]": {
        const item = this.decoder({ kind: "struct", struct: type.struct, nullable: false, text: type.struct });
        return (v, p) => {
          if (!Array.isArray(v)) throw mismatch(p, `array of ${type.struct}`, v);
          return v.map((x: unknown, i) => item(x, `${p}[${i}]`));
        };
      }
    }
  }
}

export interface Codec {
  readonly schema: Schema;
  /** Packs a message as [tag, ...fields]; throws ProtocolError for a value that does not fit its field. */
  encode(message: WireMessage): Buffer;
  /** Unpacks and validates one message; throws ProtocolError naming the offending field. */
  decode(bytes: Uint8Array): WireMessage;
}

interface CompiledMessage {
  message: SchemaMessage;
  encode: (obj: Record<string, unknown>, path: string, out: unknown[]) => void;
  decode: (values: readonly unknown[], offset: number, path: string, out: Record<string, unknown>) => void;
}

/** Builds a codec for a schema. The default codec (encode/decode below) uses schema.json. */
export function createCodec(schema: Schema): Codec {
  const builder = new CodecBuilder(schema);
  const byName = new Map<string, CompiledMessage>();
  const byTag = new Map<string, CompiledMessage>();
  for (const message of schema.messages.values()) {
    const compiled = { message, encode: builder.fieldsEncoder(message.fields), decode: builder.fieldsDecoder(message.fields) };
    byName.set(message.name, compiled);
    byTag.set(message.tag, compiled);
  }

  return {
    schema,
    encode(message: WireMessage): Buffer {
      const kind: unknown = (message as { kind?: unknown }).kind;
      const compiled = typeof kind === "string" ? byName.get(kind) : undefined;
      if (compiled === undefined) throw new ProtocolError(`kind: unknown message kind ${JSON.stringify(kind)}`, "kind");
      const out: unknown[] = [compiled.message.tag];
      compiled.encode(message as unknown as Record<string, unknown>, compiled.message.name, out);
      return packr.pack(out);
    },

    decode(bytes: Uint8Array): WireMessage {
      let raw: unknown;
      try {
        raw = packr.unpack(bytes);
      } catch (error) {
        throw new ProtocolError(`message: not valid MessagePack (${(error as Error).message})`, "message");
      }
      if (!Array.isArray(raw) || raw.length === 0) throw mismatch("message", "array [tag, ...fields]", raw);
      const tag: unknown = raw[0];
      if (typeof tag !== "string") throw mismatch("tag", "string", tag);
      const compiled = byTag.get(tag);
      if (compiled === undefined) throw new ProtocolError(`tag: unknown message tag ${JSON.stringify(tag)}`, "tag");
      const { name, fields } = compiled.message;
      if (raw.length - 1 !== fields.length) {
        throw new ProtocolError(`${name}: expected ${fields.length} fields after the tag, got ${raw.length - 1}`, name);
      }
      const out: Record<string, unknown> = { kind: name };
      compiled.decode(raw, 1, name, out);
      return out as unknown as WireMessage;
    },
  };
}

let defaultCodec: Codec | undefined;

/** The codec for protocol/schema.json (through the tables generated into messages.ts). */
function wireCodec(): Codec {
  defaultCodec ??= createCodec(loadSchema());
  return defaultCodec;
}

export function encode(message: WireMessage): Buffer {
  return wireCodec().encode(message);
}

export function decode(bytes: Uint8Array): WireMessage {
  return wireCodec().decode(bytes);
}

const ENGINE_KINDS: ReadonlySet<string> = new Set([...loadSchema().messages.values()].filter((m) => m.from === "engine").map((m) => m.name));

/** Decodes a message the worker sent; a message only the engine may send is a ProtocolError. */
export function decodeWorkerMessage(bytes: Uint8Array): WorkerToEngineMessage {
  const message = decode(bytes);
  if (ENGINE_KINDS.has(message.kind)) throw new ProtocolError(`tag: ${message.kind} is not a worker message`, "tag");
  return message as WorkerToEngineMessage;
}

/** Decodes a message the engine sent (used by tests that play the worker). */
export function decodeEngineMessage(bytes: Uint8Array): EngineToWorkerMessage {
  const message = decode(bytes);
  if (!ENGINE_KINDS.has(message.kind)) throw new ProtocolError(`tag: ${message.kind} is not an engine message`, "tag");
  return message as EngineToWorkerMessage;
}
