// Incremental scanning of one JSON object that names a call, as hermes,
// llama3_json, mistral's JSON list and tool_choice "required" write it:
// {"name": "get_weather", "arguments": {"city": "Paris"}} ("parameters" is
// taken for "arguments"; keys in any order; other keys skipped). Text arrives
// in pieces: the name is reported once its string is complete, the arguments'
// JSON text as it arrives, so a stream shows argument fragments while the
// model writes them.
//
// The scanner tracks JSON structure (nesting, strings, escapes) only as far
// as it needs to find where values end; it does not validate the arguments.

import type { ToolCallDelta, ToolCallEmitter } from "./tool-call.js";

/** Where a JSON value ends, fed one character at a time. */
export class JsonValueEnd {
  private kind: "container" | "string" | "scalar" | null = null;
  private depth = 0;
  private inString = false;
  private escape = false;

  get started(): boolean {
    return this.kind !== null;
  }

  get isString(): boolean {
    return this.kind === "string";
  }

  /**
   * "more": c belongs to the value, which goes on; "end": c is its last
   * character; "before": the value (a number or literal) ended before c;
   * "bad": c cannot start a value. Whitespace before the value is "more".
   */
  step(c: string): "more" | "end" | "before" | "bad" {
    switch (this.kind) {
      case null:
        if (isSpace(c)) return "more";
        if (c === "{" || c === "[") {
          this.kind = "container";
          this.depth = 1;
          return "more";
        }
        if (c === '"') {
          this.kind = "string";
          return "more";
        }
        if (c === "," || c === "}" || c === "]" || c === ":") return "bad";
        this.kind = "scalar";
        return "more";
      case "string":
        if (this.escape) this.escape = false;
        else if (c === "\\") this.escape = true;
        else if (c === '"') return "end";
        return "more";
      case "scalar":
        return c === "," || c === "}" || c === "]" || isSpace(c) ? "before" : "more";
      case "container":
        if (this.inString) {
          if (this.escape) this.escape = false;
          else if (c === "\\") this.escape = true;
          else if (c === '"') this.inString = false;
          return "more";
        }
        if (c === '"') this.inString = true;
        else if (c === "{" || c === "[") this.depth++;
        else if (c === "}" || c === "]") {
          this.depth--;
          if (this.depth === 0) return "end";
        }
        return "more";
    }
  }
}

function isSpace(c: string): boolean {
  return c === " " || c === "\n" || c === "\t" || c === "\r";
}

export interface CallEvents {
  /** The call's name, once its string is complete. */
  name(name: string): void;
  /** A fragment of the arguments' JSON text. */
  args(fragment: string): void;
}

export interface ScanResult {
  /** Characters of the piece consumed (all of it unless the object ended or an error came). */
  used: number;
  done: boolean;
  /** Why the text is not a call object (the character at `used` is the offending one). */
  error: string | null;
}

type ScanState = "start" | "key-or-end" | "key" | "key-start" | "colon" | "value" | "after-value" | "done";

const ARGUMENT_KEYS = new Set(["arguments", "parameters"]);

/** Scans one call object; feed() it pieces until done or an error. */
export class JsonCallScanner {
  private state: ScanState = "start";
  private key = "";
  private keyEscape = false;
  private value: JsonValueEnd | null = null;
  private role: "name" | "args" | "skip" = "skip";
  /** The current value's text (name values, and arguments given as a JSON string). */
  private raw = "";
  private sawArgs = false;
  private sawName = false;
  /** Argument text of the current feed. */
  private fragment = "";

  constructor(private readonly events: CallEvents) {}

  get nameSeen(): boolean {
    return this.sawName;
  }

  feed(text: string): ScanResult {
    // Argument text is reported once per feed, whatever ends the feed.
    this.fragment = "";
    const result = this.scan(text);
    this.flush();
    return result;
  }

  private flush(): void {
    if (this.fragment !== "") this.events.args(this.fragment);
    this.fragment = "";
  }

  private scan(text: string): ScanResult {
    for (let i = 0; i < text.length; i++) {
      const c = text[i] as string;
      switch (this.state) {
        case "start":
          if (isSpace(c)) continue;
          if (c !== "{") return { used: i, done: false, error: "a tool call must be a JSON object" };
          this.state = "key-or-end";
          continue;
        case "key-or-end":
        case "key-start":
          if (isSpace(c)) continue;
          if (c === '"') {
            this.state = "key";
            this.key = "";
            continue;
          }
          if (c === "}" && this.state === "key-or-end") {
            this.flush();
            return this.end(i + 1);
          }
          return { used: i, done: false, error: "expected a key in the tool call object" };
        case "key":
          if (this.keyEscape) this.keyEscape = false;
          else if (c === "\\") this.keyEscape = true;
          else if (c === '"') {
            this.state = "colon";
            continue;
          }
          this.key += c;
          continue;
        case "colon":
          if (isSpace(c)) continue;
          if (c !== ":") return { used: i, done: false, error: "expected ':' in the tool call object" };
          this.state = "value";
          this.value = new JsonValueEnd();
          this.raw = "";
          this.role = this.key === "name" ? "name" : ARGUMENT_KEYS.has(this.key) && !this.sawArgs ? "args" : "skip";
          continue;
        case "value": {
          const value = this.value as JsonValueEnd;
          const step = value.step(c);
          if (step === "bad") return { used: i, done: false, error: `expected a value for ${JSON.stringify(this.key)}` };
          if (step === "before") {
            this.endValue();
            i--; // c is the delimiter after a number or literal: look at it again
            continue;
          }
          if (value.started) {
            if (this.role === "args" && !value.isString) this.fragment += c;
            else if (this.role !== "skip") this.raw += c;
          }
          if (step === "end") {
            this.flush();
            this.endValue();
          }
          continue;
        }
        case "after-value":
          if (isSpace(c)) continue;
          if (c === ",") {
            this.state = "key-start";
            continue;
          }
          if (c === "}") {
            this.flush();
            return this.end(i + 1);
          }
          return { used: i, done: false, error: "expected ',' or '}' in the tool call object" };
        case "done":
          return { used: i, done: true, error: null };
      }
    }
    return { used: text.length, done: false, error: null };
  }

  private endValue(): void {
    if (this.role === "name") {
      const name = parseJsonString(this.raw);
      if (name !== null) {
        this.sawName = true;
        this.events.name(name);
      }
    } else if (this.role === "args") {
      this.sawArgs = true;
      // Arguments written as a JSON string holding JSON: the string's content is the arguments.
      if ((this.value as JsonValueEnd).isString) this.events.args(parseJsonString(this.raw) ?? "{}");
    }
    this.state = "after-value";
    this.value = null;
  }

  private end(used: number): ScanResult {
    this.state = "done";
    if (!this.sawArgs) this.events.args("{}");
    if (!this.sawName) return { used, done: true, error: "the tool call has no name" };
    return { used, done: true, error: null };
  }
}

function parseJsonString(raw: string): string | null {
  try {
    const value: unknown = JSON.parse(raw);
    return typeof value === "string" ? value : null;
  } catch {
    return null;
  }
}

/**
 * One JSON call object being parsed, shown through `emitter` once its name
 * is known (arguments written before the name wait for it). `consumed` keeps
 * the text taken before the name, to release as content if the object turns
 * out not to be a call.
 */
export class JsonCall {
  private named = false;
  private pendingArgs = "";
  private deltas: ToolCallDelta[] = [];
  private readonly scanner: JsonCallScanner;

  constructor(
    private readonly emitter: ToolCallEmitter,
    public consumed: string,
  ) {
    this.scanner = new JsonCallScanner({
      name: (name) => {
        this.named = true;
        this.deltas.push(...this.emitter.begin(name), ...this.emitter.args(this.pendingArgs));
        this.pendingArgs = "";
      },
      args: (fragment) => {
        if (this.named) this.deltas.push(...this.emitter.args(fragment));
        else this.pendingArgs += fragment;
      },
    });
  }

  get isNamed(): boolean {
    return this.named;
  }

  /** Scans `text`; the deltas are those this text produced. */
  feed(text: string): { result: ScanResult; deltas: ToolCallDelta[] } {
    const result = this.scanner.feed(text);
    if (!this.named) this.consumed += text.slice(0, result.used);
    const deltas = this.deltas;
    this.deltas = [];
    return { result, deltas };
  }
}
