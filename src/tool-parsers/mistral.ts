// mistral: calls follow the [TOOL_CALLS] control token, in either of
// Mistral's two formats:
//
//   [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]   (tokenizer v3)
//   [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]other[ARGS]{...}     (tokenizer v11+;
//                                                      [CALL_ID]id may come before [ARGS])
//
// Text before the first [TOOL_CALLS] is content. Call ids are 9 alphanumeric
// characters (Mistral's chat templates refuse others); a [CALL_ID] the model
// wrote is kept when it has that form. [TOOL_CALLS] is a special token, so
// requests parsed this way are detokenized with special tokens kept.

import { JsonCall, JsonValueEnd } from "./json-call.js";
import { StreamingToolParser } from "./streaming-parser.js";
import type { ToolCallEmitter } from "./tool-call.js";

const TOOL_CALLS = "[TOOL_CALLS]";
const ARGS = "[ARGS]";
const CALL_ID = "[CALL_ID]";
const NAME = /^[A-Za-z0-9_.-]*$/;
const MISTRAL_ID = /^[A-Za-z0-9]{9}$/;

type State = "content" | "after-marker" | "item" | "json-call" | "separator" | "name" | "call-id" | "args" | "between";

export class MistralToolParser extends StreamingToolParser {
  private state: State = "content";
  private call: JsonCall | null = null;
  /** Text of the current [TOOL_CALLS]name... call taken before its header went out. */
  private consumed = "";
  private name = "";
  private value: JsonValueEnd | null = null;

  constructor(private readonly emitter: ToolCallEmitter) {
    super();
  }

  protected step(): boolean {
    switch (this.state) {
      case "content":
        if (this.contentUntil([TOOL_CALLS]) === null) return false;
        this.afterMarker();
        return true;
      case "after-marker": {
        const lead = this.held.length - this.held.trimStart().length;
        if (lead === this.held.length) return this.final ? this.fail() : false;
        if (this.held[lead] === "[") {
          this.held = this.held.slice(lead + 1);
          this.state = "item";
          return true;
        }
        this.consumed += this.held.slice(0, lead);
        this.held = this.held.slice(lead);
        this.name = "";
        this.state = "name";
        return true;
      }
      case "item":
        if (!this.skipSpace()) return false;
        if (this.held[0] === "]") {
          this.held = this.held.slice(1);
          this.state = "between";
          return true;
        }
        this.call = new JsonCall(this.emitter, "");
        this.state = "json-call";
        return true;
      case "json-call": {
        const fed = this.feedCall(this.call as JsonCall);
        if (fed === "more") return false;
        this.state = fed === "done" ? "separator" : "content";
        return true;
      }
      case "separator":
        if (!this.skipSpace()) return false;
        if (this.held[0] === ",") {
          this.held = this.held.slice(1);
          this.state = "item";
        } else if (this.held[0] === "]") {
          this.held = this.held.slice(1);
          this.state = "between";
        } else {
          this.state = "content";
        }
        return true;
      case "name": {
        const at = this.held.indexOf("[");
        const name = at < 0 ? this.held : this.held.slice(0, at);
        if (!NAME.test(name) || this.name.length + name.length > 64) return this.fail();
        this.name += name;
        this.consumed += name;
        this.held = this.held.slice(name.length);
        if (at < 0) return this.final ? this.fail() : false;
        const found = this.startsWith([ARGS, CALL_ID]);
        if (found === "wait") return false;
        if (found === null || this.name === "") return this.fail();
        this.consumed += found;
        if (found === CALL_ID) {
          this.state = "call-id";
          return true;
        }
        this.beginArgs(null);
        return true;
      }
      case "call-id": {
        const at = this.held.indexOf(ARGS);
        if (at < 0) {
          if (this.held.length > 64 || this.final) return this.fail();
          return false;
        }
        const id = this.held.slice(0, at);
        this.consumed += this.held.slice(0, at + ARGS.length);
        this.held = this.held.slice(at + ARGS.length);
        this.beginArgs(MISTRAL_ID.test(id) ? id : null);
        return true;
      }
      case "args": {
        const value = this.value as JsonValueEnd;
        let fragment = "";
        let used = 0;
        let ended = false;
        for (; used < this.held.length && !ended; used++) {
          const c = this.held[used] as string;
          const step = value.step(c);
          if (step === "bad" || step === "before") {
            ended = true;
            used--; // c is not part of the arguments
          } else {
            if (value.started) fragment += c;
            ended = step === "end";
          }
        }
        this.held = this.held.slice(used);
        this.calls(this.emitter.args(fragment));
        if (!ended) return false;
        this.state = "between";
        return true;
      }
      case "between": {
        if (!this.skipSpace()) return false;
        const found = this.startsWith([TOOL_CALLS]);
        if (found === "wait") return false;
        if (found === null) this.state = "content";
        else this.afterMarker();
        return true;
      }
    }
  }

  private afterMarker(): void {
    this.consumed = TOOL_CALLS;
    this.state = "after-marker";
  }

  private beginArgs(id: string | null): void {
    this.calls(this.emitter.begin(this.name, id));
    this.value = new JsonValueEnd();
    this.state = "args";
  }

  /** What followed [TOOL_CALLS] is not a call: it is content, and so is the rest. */
  private fail(): boolean {
    this.content(this.consumed);
    this.consumed = "";
    this.state = "content";
    return true;
  }
}
