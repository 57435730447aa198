// What every route needs, built once by the server.

import type { ReasoningParserName } from "../reasoning/reasoning-parser.js";
import type { ChatTemplate } from "../text/chat-template.js";
import type { ToolCallParserName } from "../tool-parsers/tool-parser.js";
import type { DetokenizerBatcher } from "../text/detokenizer.js";
import type { TextTokenizer } from "../text/tokenizer.js";
import type { GrammarSpec } from "../structured/grammar-spec.js";
import type { RequestSessions } from "./request-session.js";
import type { ModelLimits } from "./sampling.js";
import type { TokenStrings } from "./token-strings.js";
import type { AudioPrompt, SpeechRecognition, VisionPrompt } from "../config/model-dir.js";
import type { MediaOptions } from "./media.js";
import type { LoraCatalog } from "./lora-adapters.js";

/** What the frontend needs of the grammar engine (GrammarService). */
export interface GrammarCompiling {
  /** null when `spec` compiled, else why it cannot be. */
  compile(spec: GrammarSpec): Promise<string | null>;
}

export interface FrontendContext {
  tokenizer: TextTokenizer;
  detokenizer: DetokenizerBatcher;
  /** Token strings for logprobs. */
  tokenStrings: TokenStrings;
  /** null when the model has none: chat requests get a 400. */
  chatTemplate: ChatTemplate | null;
  servedModelName: string;
  limits: ModelLimits;
  /** Token ids must be below this. */
  vocabSize: number;
  /** Every request to the engine goes through its session (admission, metrics, the live registry). */
  sessions: RequestSessions;
  /** --reasoning-parser: splits chat output into reasoning_content and content; null: off. */
  reasoningParser: ReasoningParserName | null;
  /** --tool-call-parser: how tool_choice "auto" reads the model's calls; null: none. */
  toolCallParser: ToolCallParserName | null;
  /** --enable-auto-tool-choice. */
  enableAutoToolChoice: boolean;
  /** The grammar engine for structured output; null: such requests get a 400. */
  grammars: GrammarCompiling | null;
  /** How images sit in the model's prompts; null: a model without vision (image parts are a 400). */
  vision: VisionPrompt | null;
  /** How audio sits in the model's prompts; null: a model that does not hear (audio parts are a 400). */
  audio: AudioPrompt | null;
  /** A speech-recognition model's prompt tokens and audio window; null: transcription requests are a 400. */
  speech: SpeechRecognition | null;
  /** What image parts may load. */
  media: MediaOptions;
  /** --enable-lora: the adapters a request's \`model\` may name; null: LoRA off. */
  adapters: LoraCatalog | null;
  /** null while requests can be served; otherwise why not (503). */
  unavailableReason(): string | null;
  /** A request carried fields this route ignores (logged once per field name). */
  noteIgnoredFields(route: string, names: readonly string[]): void;
}
