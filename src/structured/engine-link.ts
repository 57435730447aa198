// How an engine core gets its grammar masks: a port to the grammar thread,
// usable only when the grammar thread makes masks as wide as the worker's
// logits.

import type { MessagePort } from "node:worker_threads";
import { GrammarClient } from "./grammar-client.js";
import { StepMasks } from "./step-masks.js";

/** The engine core's StepMasks, or null (structured output refused) without a grammar thread or when its vocabulary is not the worker's. */
export function stepMasks(grammar: { port: MessagePort; vocabSize: number } | null, workerVocabSize: number): StepMasks | null {
  if (grammar === null) return null;
  if (grammar.vocabSize !== workerVocabSize) {
    grammar.port.close();
    return null;
  }
  return new StepMasks(new GrammarClient(grammar.port, grammar.vocabSize));
}
