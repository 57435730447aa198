// qwen3_coder (Qwen3-Coder's XML-style calls):
//
//   <tool_call>
//   <function=get_weather>
//   <parameter=city>
//   Paris
//   </parameter>
//   <parameter=days>
//   3
//   </parameter>
//   </function>
//   </tool_call>
//
// Parameter values are text; each becomes JSON by the type its function's
// schema gives the parameter (integer, number, boolean, null, object, array;
// strings and parameters without a known type stay strings). One newline
// around a value is the format's, not the value's. The arguments stream one
// parameter at a time ({"city": "Paris" then , "days": 3 then }), since a
// value's JSON is known only once it is complete. A missing </parameter>
// before the next <parameter= or </function> is tolerated, as is a call that
// starts at <function= without <tool_call>.

import { StreamingToolParser } from "./streaming-parser.js";
import type { ToolCallEmitter, ToolFunction } from "./tool-call.js";

const CALL_START = "<tool_call>";
const CALL_END = "</tool_call>";
const FUNCTION = "<function=";
const FUNCTION_END = "</function>";
const PARAMETER = "<parameter=";
const PARAMETER_END = "</parameter>";

type State = "content" | "open" | "function-name" | "params" | "param-name" | "param-value" | "close" | "between";

export class Qwen3CoderToolParser extends StreamingToolParser {
  private state: State = "content";
  /** Text of the current call taken before its header went out (content if it turns out not to be a call). */
  private consumed = "";
  private properties: Record<string, unknown> = {};
  private numParams = 0;
  private param = "";

  constructor(
    private readonly emitter: ToolCallEmitter,
    private readonly tools: readonly ToolFunction[],
  ) {
    super();
  }

  protected step(): boolean {
    switch (this.state) {
      case "content": {
        const found = this.contentUntil([CALL_START, FUNCTION]);
        if (found === null) return false;
        this.consumed = found;
        this.state = found === CALL_START ? "open" : "function-name";
        return true;
      }
      case "open": {
        const lead = this.held.length - this.held.trimStart().length;
        const rest = this.held.slice(lead);
        if (rest.startsWith(FUNCTION)) {
          this.consumed += this.held.slice(0, lead + FUNCTION.length);
          this.held = rest.slice(FUNCTION.length);
          this.state = "function-name";
          return true;
        }
        if ((rest === "" || FUNCTION.startsWith(rest)) && !this.final) return false;
        return this.fail();
      }
      case "function-name": {
        const at = this.held.indexOf(">");
        if (at < 0) return this.held.length > 128 || /[<\n]/.test(this.held) || this.final ? this.fail() : false;
        const name = this.held.slice(0, at).trim();
        if (name === "" || /[<\n]/.test(name)) return this.fail();
        this.held = this.held.slice(at + 1);
        this.consumed = "";
        const fn = this.tools.find((t) => t.name === name);
        const props = fn?.parameters?.properties;
        this.properties = typeof props === "object" && props !== null ? (props as Record<string, unknown>) : {};
        this.numParams = 0;
        this.calls(this.emitter.begin(name));
        this.state = "params";
        return true;
      }
      case "params": {
        if (!this.skipSpace()) return false;
        const found = this.startsWith([PARAMETER, FUNCTION_END]);
        if (found === "wait") return false;
        if (found === PARAMETER) {
          this.state = "param-name";
          return true;
        }
        // </function>, or text that has no place here: the call ends.
        this.calls(this.emitter.args(this.numParams === 0 ? "{}" : "}"));
        this.state = found === null ? "content" : "close";
        return true;
      }
      case "param-name": {
        const at = this.held.indexOf(">");
        if (at < 0) return false;
        this.param = this.held.slice(0, at).trim();
        this.held = this.held.slice(at + 1);
        this.state = "param-value";
        return true;
      }
      case "param-value": {
        let end = -1;
        let marker = "";
        for (const m of [PARAMETER_END, PARAMETER, FUNCTION_END]) {
          const i = this.held.indexOf(m);
          if (i >= 0 && (end < 0 || i < end)) {
            end = i;
            marker = m;
          }
        }
        // A value is emitted whole; a call cut off inside one keeps the parameters before it.
        if (end < 0) return false;
        const value = this.held.slice(0, end);
        this.held = this.held.slice(end + (marker === PARAMETER_END ? marker.length : 0));
        const json = JSON.stringify(this.param) + ": " + JSON.stringify(convertParameter(value, this.properties[this.param]));
        this.calls(this.emitter.args((this.numParams === 0 ? "{" : ", ") + json));
        this.numParams++;
        this.state = "params";
        return true;
      }
      case "close": {
        if (!this.skipSpace()) return false;
        if (this.startsWith([CALL_END]) === "wait") return false;
        this.state = "between";
        return true;
      }
      case "between": {
        if (!this.skipSpace()) return false;
        const found = this.startsWith([CALL_START, FUNCTION]);
        if (found === "wait") return false;
        if (found === null) {
          this.state = "content";
          return true;
        }
        this.consumed = found;
        this.state = found === CALL_START ? "open" : "function-name";
        return true;
      }
    }
  }

  /** What followed the call marker is not a call: it is content. */
  private fail(): boolean {
    this.content(this.consumed);
    this.consumed = "";
    this.state = "content";
    return true;
  }
}

/** A parameter's text as the JSON value its schema's type says (a string when it says nothing usable). */
export function convertParameter(text: string, schema: unknown): unknown {
  let value = text.startsWith("\n") ? text.slice(1) : text;
  if (value.endsWith("\n")) value = value.slice(0, -1);
  const declared = typeof schema === "object" && schema !== null ? (schema as { type?: unknown }).type : undefined;
  const types = Array.isArray(declared) ? declared : [declared];
  for (const type of types) {
    switch (type) {
      case "integer":
        if (/^-?\d+$/.test(value.trim())) return Number(value.trim());
        break;
      case "number": {
        const n = Number(value.trim());
        if (value.trim() !== "" && Number.isFinite(n)) return n;
        break;
      }
      case "boolean":
        if (/^(true|false)$/i.test(value.trim())) return value.trim().toLowerCase() === "true";
        break;
      case "null":
        if (value.trim().toLowerCase() === "null") return null;
        break;
      case "object":
      case "array":
        try {
          const parsed: unknown = JSON.parse(value);
          if (type === "array" ? Array.isArray(parsed) : typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)) return parsed;
        } catch {
          // not JSON: kept as text
        }
        break;
      default:
        break;
    }
  }
  return value;
}
