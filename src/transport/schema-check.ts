// Keeps messages.ts honest against protocol/schema.json. The table below
// restates every message and struct as the TS side believes it to be; the
// compiler checks the table against the interfaces in messages.ts (names,
// and that each wire type maps to the declared TS type), and
// checkSchemaAgreement() checks it against schema.json at start-up (names,
// order, types, tags). Drift in either direction fails loudly.

import {
  PROTOCOL_VERSION,
  type AddedRequest,
  type FatalMessage,
  type PingMessage,
  type PongMessage,
  type ReadyMessage,
  type SamplingParams,
  type ShutdownMessage,
  type StepMessage,
  type StepResultMessage,
  type StepTimings,
  type WireMessage,
} from "./messages.js";
import type { Schema, SchemaField } from "./schema.js";

interface StructTypes {
  SamplingParams: SamplingParams;
  AddedRequest: AddedRequest;
  StepTimings: StepTimings;
}

/** The TS type a schema type string decodes to. */
type TsOf<T extends string> = T extends `${infer Base}?`
  ? TsOf<Base> | null
  : T extends "int" | "float"
    ? number
    : T extends "str"
      ? string
      : T extends "bool"
        ? boolean
        : T extends "i32[]"
          ? Int32Array
          : T extends "f32[]"
            ? Float32Array
            : T extends "u8[]"
              ? Uint8Array
              : T extends "int[]"
                ? number[]
                : T extends `${infer S extends keyof StructTypes}[]`
                  ? StructTypes[S][]
                  : T extends keyof StructTypes
                    ? StructTypes[T]
                    : never;

type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
type FieldsOf<T> = Exclude<keyof T, "kind">;
type Spec<T> = { [K in FieldsOf<T>]: string };
/** Every field of T listed, no extras, and each wire type decodes to T's field type. */
type Agrees<T, S> = { [K in FieldsOf<T>]: K extends keyof S ? (Same<TsOf<S[K] & string>, T[K]> extends true ? S[K] : never) : never } & {
  [K in Exclude<keyof S, FieldsOf<T>>]: never;
};

// Object literal key order is insertion order, so the table also states field order.
// Exported so a test can prove (with @ts-expect-error) that drift fails to compile.
export function mirror<T>() {
  return <const S extends Spec<T>>(spec: S & Agrees<T, S>): S => spec;
}

type MessageName = WireMessage["kind"];
type MessageOf<K extends MessageName> = Extract<WireMessage, { kind: K }>;

export const TS_STRUCTS = {
  SamplingParams: mirror<SamplingParams>()({
    temperature: "float",
    top_p: "float",
    top_k: "int",
    min_p: "float",
    seed: "int?",
    presence_penalty: "float",
    frequency_penalty: "float",
    repetition_penalty: "float",
    min_tokens: "int",
    suppress_token_ids: "i32[]",
    logprobs: "int",
  }),
  AddedRequest: mirror<AddedRequest>()({
    req_id: "int",
    token_ids: "i32[]",
    num_prompt_tokens: "int",
    sampling: "SamplingParams",
  }),
  StepTimings: mirror<StepTimings>()({ prepare_ms: "float", forward_ms: "float", sample_ms: "float" }),
} satisfies { [K in keyof StructTypes]: Spec<StructTypes[K]> };

export const TS_MESSAGES = {
  Step: mirror<StepMessage>()({
    step_id: "int",
    added: "AddedRequest[]",
    removed: "i32[]",
    req_ids: "i32[]",
    num_new_tokens: "i32[]",
    num_computed: "i32[]",
    new_block_counts: "i32[]",
    new_block_ids: "i32[]",
    sample: "u8[]",
  }),
  Ping: mirror<PingMessage>()({ nonce: "int" }),
  Shutdown: mirror<ShutdownMessage>()({}),
  Ready: mirror<ReadyMessage>()({
    protocol_version: "int",
    num_blocks: "int",
    block_size: "int",
    max_model_len: "int",
    vocab_size: "int",
    architecture: "str",
    dtype: "str",
    device: "str",
    worker_pid: "int",
  }),
  StepResult: mirror<StepResultMessage>()({
    step_id: "int",
    req_ids: "i32[]",
    token_ids: "i32[]",
    logprobs: "f32[]?",
    top_counts: "i32[]?",
    top_ids: "i32[]?",
    top_logprobs: "f32[]?",
    timings: "StepTimings",
  }),
  Pong: mirror<PongMessage>()({ nonce: "int" }),
  Fatal: mirror<FatalMessage>()({ message: "str" }),
} satisfies { [K in MessageName]: Spec<MessageOf<K>> };

/** Which side sends each message, as messages.ts's union types say. */
export const TS_DIRECTION: { [K in MessageName]: "engine" | "worker" } = {
  Step: "engine",
  Ping: "engine",
  Shutdown: "engine",
  Ready: "worker",
  StepResult: "worker",
  Pong: "worker",
  Fatal: "worker",
};

function describe(fields: readonly SchemaField[]): string {
  return fields.map((f) => `${f.name}: ${f.type.text}`).join(", ");
}

function compareFields(where: string, schemaFields: readonly SchemaField[], spec: Record<string, string>, problems: string[]): void {
  const ts = Object.entries(spec);
  const same =
    ts.length === schemaFields.length && ts.every(([name, type], i) => schemaFields[i]?.name === name && schemaFields[i]?.type.text === type);
  if (!same) {
    problems.push(`${where}: schema.json has [${describe(schemaFields)}], messages.ts has [${ts.map(([n, t]) => `${n}: ${t}`).join(", ")}]`);
  }
}

/** Lists every disagreement between schema.json and messages.ts (empty when they agree). */
export function schemaDisagreements(schema: Schema): string[] {
  const problems: string[] = [];
  if (schema.protocolVersion !== PROTOCOL_VERSION) {
    problems.push(`protocol_version: schema.json has ${schema.protocolVersion}, messages.ts PROTOCOL_VERSION is ${PROTOCOL_VERSION}`);
  }
  const tsStructs: Record<string, Record<string, string>> = TS_STRUCTS;
  const tsMessages: Record<string, Record<string, string>> = TS_MESSAGES;
  for (const name of new Set([...schema.structs.keys(), ...Object.keys(tsStructs)])) {
    const fields = schema.structs.get(name);
    const spec = tsStructs[name];
    if (fields === undefined) problems.push(`struct ${name}: in messages.ts but not in schema.json`);
    else if (spec === undefined) problems.push(`struct ${name}: in schema.json but not in messages.ts`);
    else compareFields(`struct ${name}`, fields, spec, problems);
  }
  for (const name of new Set([...schema.messages.keys(), ...Object.keys(tsMessages)])) {
    const message = schema.messages.get(name);
    const spec = tsMessages[name];
    if (message === undefined) problems.push(`message ${name}: in messages.ts but not in schema.json`);
    else if (spec === undefined) problems.push(`message ${name}: in schema.json but not in messages.ts`);
    else {
      compareFields(`message ${name}`, message.fields, spec, problems);
      const direction = TS_DIRECTION[name as MessageName];
      if (message.from !== direction) problems.push(`message ${name}: schema.json says from ${message.from}, messages.ts says ${direction}`);
    }
  }
  return problems;
}

/** Throws if messages.ts and schema.json disagree; called when the codec is built. */
export function checkSchemaAgreement(schema: Schema): void {
  const problems = schemaDisagreements(schema);
  if (problems.length > 0) {
    throw new Error(`src/transport/messages.ts and protocol/schema.json disagree:\n  ${problems.join("\n  ")}`);
  }
}
