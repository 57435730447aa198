// One text request's life on the frontend side: submit it through its
// session (request-session.ts: admission, metrics, the live registry), turn
// each step's token ids into text through the request's detokenizer session,
// and hand ordered deltas to the endpoint (streamed or collected).

import { RequestRejectedError } from "../engine/engine-core.js";
import type { EngineRequest, PromptTokenLogprob, RequestId, RequestOutput, TokenLogprob } from "../engine/types.js";
import type { DetokenizerSession } from "../text/detokenizer.js";
import type { StopStringMatcher } from "../text/stop-strings.js";
import type { TokenText, TokenTextSession, TokenVocabulary } from "../text/token-text.js";
import { ApiError, badRequest, serverError, serviceUnavailable } from "./openai-error.js";
import type { RequestSessions, SessionOwner } from "./request-session.js";

export type OpenAIFinishReason = "stop" | "length";

/** A token on its own (an alternative): TokenVocabulary.lone and its bytes. */
export interface ResolvedAlternative {
  tokenId: number;
  token: string;
  bytes: number[];
  logprob: number;
}

/**
 * A generated token's logprob with its text: the text it adds to the output
 * (the strings of a choice join to its text), the bytes it adds, and the top
 * alternatives, each on its own (the generated token among them keeps its text).
 */
export interface ResolvedLogprob extends ResolvedAlternative {
  top: ResolvedAlternative[];
}

/** A prompt token's logprob (vLLM's prompt_logprobs): the token and its alternatives on their own, with its rank. */
export interface ResolvedPromptLogprob extends ResolvedAlternative {
  rank: number;
  top: ResolvedAlternative[];
}

export interface GenerationDelta {
  /** Text that became final with these tokens ("" while held back). */
  text: string;
  /** Generated ids of this step, stop token included. */
  tokenIds: number[];
  /** One entry per id in tokenIds when the request asked for logprobs, else null. */
  logprobs: ResolvedLogprob[] | null;
  /** With the first tokens of a request that asked for prompt logprobs: one entry per prompt token after the first; else null. */
  promptLogprobs: ResolvedPromptLogprob[] | null;
  finishReason: OpenAIFinishReason | null;
  /** vLLM's stop_reason: the stop_token_ids entry or stop string that ended the request; null for EOS and length. */
  stopReason: number | string | null;
}

export interface GenerationOptions {
  /** Stop strings of the request; null when it has none. */
  stopStrings?: StopStringMatcher | null;
  /** Token strings of alternatives and prompt tokens; needed when the request asks for logprobs or prompt logprobs. */
  vocabulary?: TokenVocabulary | null;
  /** The text each generated token adds; needed when the request asks for logprobs. */
  tokenTexts?: TokenTextSession | null;
}

export interface GenerationSink {
  onDelta(delta: GenerationDelta): void;
  /** Terminal; no call follows. */
  onError(error: ApiError): void;
}

export class Generation implements SessionOwner {
  /** Generated tokens delivered to the sink so far (what usage.completion_tokens counts). */
  completionTokens = 0;
  /** Prompt tokens the engine served from the prefix cache (usage.prompt_tokens_details.cached_tokens). */
  numCachedTokens = 0;
  /** The prompt's length as the model's process_prompt expanded it (its audio's tokens); null: the request's own. */
  numPromptTokens: number | null = null;
  /** Generated tokens received from the engine (some may still be on their way to the sink). */
  private generatedTokens = 0;
  /** No more sink calls once closed. */
  private closed = false;
  /** The engine has finished or forgotten the request; no abort needed. */
  private engineDone = false;
  /** Deltas reach the sink in step order, whatever order their async parts finish in. */
  private tail: Promise<void> = Promise.resolve();

  constructor(
    private readonly sessions: RequestSessions,
    /** What the client and the logs call it (ChoiceSpec.name). */
    readonly name: string,
    private readonly detokenizer: DetokenizerSession,
    private readonly request: EngineRequest,
    private readonly sink: GenerationSink,
    private readonly options: GenerationOptions = {},
  ) {}

  get id(): RequestId {
    return this.request.id;
  }

  start(): void {
    try {
      this.sessions.submitText(this, this.request, (output) => this.onOutput(output));
    } catch (error) {
      this.engineDone = true;
      // A request the engine can never run (e.g. longer than the whole KV cache) is the client's to fix.
      if (error instanceof RequestRejectedError) this.fail(badRequest(error.message));
      else this.fail(error instanceof ApiError ? error : serverError(`the engine refused the request: ${(error as Error).message}`));
    }
  }

  /** The client went away: free the engine's resources, tell nobody. */
  cancel(): void {
    if (this.closed) return;
    this.closed = true;
    this.release();
  }

  /** Ends the request with an error delivered to the client. */
  fail(error: ApiError): void {
    if (this.closed) return;
    this.closed = true;
    this.release();
    this.sink.onError(error);
  }

  private release(reason?: "stop"): void {
    const engineDone = this.engineDone;
    this.engineDone = true;
    this.sessions.end(this, engineDone, reason);
  }

  private onOutput(output: RequestOutput): void {
    if (this.closed) return;
    if (output.finishReason === "error") {
      this.engineDone = true;
      const message = output.error ?? "the engine failed while generating";
      this.fail(output.errorStatus === 400 ? badRequest(message) : output.errorStatus === 503 ? serviceUnavailable(message) : serverError(message));
      return;
    }
    if (output.finishReason === "abort") {
      // Not ours (ours closes first): the engine dropped it, e.g. while shutting down.
      this.engineDone = true;
      this.fail(serviceUnavailable(output.error ?? "the request was aborted by the engine"));
      return;
    }
    const ids = output.newTokenIds;
    this.numCachedTokens = output.numCachedTokens;
    const expanded = output.promptInfo?.num_prompt_tokens?.[0];
    if (expanded !== undefined) this.numPromptTokens = expanded;
    this.generatedTokens += ids.length;
    const finishReason: OpenAIFinishReason | null = output.finished ? (output.finishReason === "length" ? "length" : "stop") : null;
    // A stop token (EOS or stop_token_ids) counts as generated but is not text (vLLM).
    const endsOnStopToken = output.finished && output.stopTokenId !== null && ids[ids.length - 1] === output.stopTokenId;
    const textIds = endsOnStopToken ? ids.slice(0, -1) : ids;
    const stopReason: number | string | null =
      endsOnStopToken && output.stopTokenId !== null && this.request.stop.stopTokenIds.includes(output.stopTokenId) ? output.stopTokenId : null;
    // The session leaves the registry with the engine's final output.
    if (output.finished) this.engineDone = true;
    // Stop strings are not checked before min_tokens are out (vLLM).
    const checkStops = this.generatedTokens >= this.request.stop.minTokens;
    const textPromise = this.detokenizer.push(textIds, output.finished);
    const vocab = this.options.vocabulary ?? null;
    const session = this.options.tokenTexts ?? null;
    let logprobs: ResolvedLogprob[] | null = null;
    if (session !== null && vocab !== null && output.logprobs !== null) {
      // The stop token adds no text (it is not part of the output text). The
      // bytes arrays are shared with the session: a token held back as part of
      // a character gets its bytes when a later token completes the character.
      const texts = session.push(textIds, output.finished);
      if (textIds.length < ids.length) texts.push({ text: "", bytes: [] });
      logprobs = resolveLogprobs(output.logprobs, texts, vocab);
    }
    const promptLogprobs = vocab !== null && output.promptLogprobs !== undefined ? resolvePromptLogprobs(output.promptLogprobs, vocab) : null;
    this.tail = this.tail.then(
      () =>
        textPromise.then(
          (text) => {
            if (this.closed) return;
            let finish = finishReason;
            let stop: number | string | null = stopReason;
            const matcher = this.options.stopStrings;
            if (matcher) {
              const match = matcher.push(text, output.finished, checkStops);
              text = match.text;
              if (match.stop !== null) {
                finish = "stop";
                stop = match.stop;
                // The engine may still be generating: free it now.
                this.closed = true;
                this.release("stop");
              }
            }
            if (output.finished) this.closed = true;
            this.completionTokens += ids.length;
            this.sink.onDelta({ text, tokenIds: ids, logprobs, promptLogprobs, finishReason: finish, stopReason: stop });
          },
          (error: unknown) => this.fail(serverError(`detokenization failed: ${(error as Error).message}`)),
        ),
    );
  }
}

function alternatives(top: TokenLogprob["top"], vocab: TokenVocabulary, chosen: ResolvedAlternative | null): ResolvedAlternative[] {
  return top.map((t) =>
    chosen !== null && t.tokenId === chosen.tokenId
      ? { ...chosen, logprob: t.logprob }
      : { tokenId: t.tokenId, token: vocab.lone(t.tokenId), bytes: vocab.loneBytes(t.tokenId), logprob: t.logprob },
  );
}

/** Generated tokens' logprobs with the text each adds (texts[i] for logprobs[i]). */
function resolveLogprobs(logprobs: readonly TokenLogprob[], texts: readonly TokenText[], vocab: TokenVocabulary): ResolvedLogprob[] {
  return logprobs.map((entry, i) => {
    const own = texts[i] ?? { text: vocab.lone(entry.tokenId), bytes: vocab.loneBytes(entry.tokenId) };
    const chosen: ResolvedAlternative = { tokenId: entry.tokenId, token: own.text, bytes: own.bytes, logprob: entry.logprob };
    return { ...chosen, top: alternatives(entry.top, vocab, chosen) };
  });
}

function resolvePromptLogprobs(entries: readonly PromptTokenLogprob[], vocab: TokenVocabulary): ResolvedPromptLogprob[] {
  return entries.map((entry) => ({
    tokenId: entry.tokenId,
    token: vocab.lone(entry.tokenId),
    bytes: vocab.loneBytes(entry.tokenId),
    logprob: entry.logprob,
    rank: entry.rank,
    top: alternatives(entry.top, vocab, null),
  }));
}
