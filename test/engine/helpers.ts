// Test helpers: run requests through an EngineCore and collect their outputs.
// The core's output batches reach each request through the frontend's own
// output processor, as in the server.

import { EngineCore, type EngineConfig, type EngineCoreOptions } from "../../src/engine/engine-core.js";
import type { EngineOutputs } from "../../src/engine/outputs.js";
import type { EngineRequest, OutputCallback, RequestOutput } from "../../src/engine/types.js";
import { OutputProcessor } from "../../src/engine-host/output-processor.js";
import type { StepExecutor } from "../../src/worker/types.js";
import { FakeExecutor, type FakeOptions } from "./fake-executor.js";

const processors = new WeakMap<object, OutputProcessor>();

/** An engine core whose outputs submit() routes per request; onBatch sees every batch first. */
export function newEngineCore(
  executor: StepExecutor,
  config: EngineConfig,
  options: Omit<EngineCoreOptions, "onOutputs"> & { onBatch?: (batch: EngineOutputs) => void } = {},
): EngineCore {
  const outputs = new OutputProcessor(false);
  const { onBatch, ...rest } = options;
  const engine = new EngineCore(executor, config, {
    ...rest,
    onOutputs: (batch) => {
      onBatch?.(batch);
      outputs.process(batch);
    },
  });
  processors.set(engine, outputs);
  return engine;
}

/** The router of an engine (an EngineCore from newEngineCore, or anything registered with routeOutputs). */
function outputsOf(engine: object): OutputProcessor {
  const outputs = processors.get(engine);
  if (outputs === undefined) throw new Error("this engine was not made by newEngineCore");
  return outputs;
}

/** Registers the processor that routes `engine`'s outputs (an engine built elsewhere with its sink). */
export function routeOutputs(engine: object, outputs: OutputProcessor): void {
  processors.set(engine, outputs);
}

/** Submits a request whose outputs go to onOutput (throws as engine.submit does). */
export function submit(engine: { submit(req: EngineRequest): void }, req: EngineRequest, onOutput: OutputCallback): void {
  engine.submit(req);
  outputsOf(engine).addText(req.id, onOutput);
}

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
      submit(engine, req, (output) => {
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
  const engine = newEngineCore(executor, {
    maxNumSeqs: 256,
    maxNumBatchedTokens: 2048,
    maxModelLen: 4096,
    ...config,
  });
  return { engine, executor };
}
