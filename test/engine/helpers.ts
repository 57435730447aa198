// Test helpers: run requests through an EngineCore and collect their outputs.

import { EngineCore, type EngineConfig } from "../../src/engine/engine-core.js";
import type { EngineRequest, RequestOutput } from "../../src/engine/types.js";
import { FakeExecutor, type FakeOptions } from "./fake-executor.js";

export interface Collected {
  outputs: RequestOutput[];
  tokens: number[];
  final: RequestOutput;
}

/** Submits and resolves with every output once the request finishes. */
export function collect(engine: EngineCore, req: EngineRequest): Promise<Collected> {
  return new Promise((resolve, reject) => {
    const outputs: RequestOutput[] = [];
    try {
      engine.submit(req, (output) => {
        outputs.push(output);
        if (output.finished) resolve({ outputs, tokens: outputs.flatMap((o) => o.newTokenIds), final: output });
      });
    } catch (error) {
      reject(error);
    }
  });
}

export function makeEngine(
  config: Partial<EngineConfig> & { numBlocks: number; blockSize: number },
  fake: Partial<FakeOptions> = {},
): { engine: EngineCore; executor: FakeExecutor } {
  const executor = new FakeExecutor({ numBlocks: config.numBlocks, blockSize: config.blockSize, ...fake });
  const engine = new EngineCore(executor, {
    maxNumSeqs: 256,
    maxNumBatchedTokens: 2048,
    maxModelLen: 4096,
    ...config,
  });
  return { engine, executor };
}
