// Messages between the main thread (HTTP frontend) and the engine thread
// (engine core + model-worker link). Each direction is one tagged union,
// posted over the worker_threads MessagePort (structured clone, no schema
// needed: both ends are this package, built together).
//
// Outputs cross as the engine core made them, one batch per step
// (engine/outputs.ts): the common case packed as int32 triples in a
// transferred buffer, everything else as plain objects.

import type { GraphEvent, GraphRequest, NodeStats, NodeStepSample } from "../conductor/graph-engine.js";
import type { Deployment } from "../config/deployment.js";
import type { EngineStats, EngineConfig } from "../engine/engine-core.js";
import type { EngineSettings } from "./types.js";
import type { WorkerHealthEvent } from "../worker/types.js";
import type { RestartPolicy } from "../worker/supervisor.js";
import type { StepTiming } from "../engine/step-timings.js";
import type { OutputBatch } from "../engine/outputs.js";
import type { EngineRequest, RequestId } from "../engine/types.js";
import type { LoraAdapterRef } from "../engine/lora.js";
import type { MessagePort } from "node:worker_threads";
import type { ReadyMessage } from "../transport/messages.js";
import type { WorkerExit, WorkerOptions } from "../worker/types.js";

/** What the engine thread is started with (workerData). */
export interface EngineThreadInit {
  /** The model worker to start, without callbacks (they cannot cross threads). */
  worker: Omit<WorkerOptions, "onLoadProgress"> & { reportLoadProgress: boolean };
  engine: EngineSettings;
  deployment: Deployment | null;
  restart: RestartPolicy;
  /** Benchmarks: time every step's phases and send them with the outputs. */
  recordSteps: boolean;
  /** Structured output: a port to the grammar thread, and the vocabulary size its masks are made for. */
  grammar?: { port: MessagePort; vocabSize: number } | null;
}

// ------------------------------------------------------------ main -> engine

export interface SubmitMessage {
  kind: "submit";
  request: EngineRequest;
}

export interface SubmitGraphMessage {
  kind: "submit-graph";
  request: GraphRequest;
}

interface AbortMessage {
  kind: "abort";
  id: RequestId;
}

/** Stop: end live requests, shut the model worker down, then the thread. */
interface CloseMessage {
  kind: "close";
}

/**
 * Stop now (the process is exiting, or close() timed out): kill the model
 * worker and close its sockets synchronously, set done[0] to 1 and notify,
 * then end the thread. The main thread may be blocked in Atomics.wait on done.
 */
interface ExitNowMessage {
  kind: "exit-now";
  done: SharedArrayBuffer;
}

/** Load a LoRA adapter; answered by a lora-loaded message with the same callId. */
interface LoraLoadMessage {
  kind: "lora-load";
  callId: number;
  ref: LoraAdapterRef;
}

interface LoraUnloadMessage {
  kind: "lora-unload";
  id: number;
}

export type MainToEngineMessage = SubmitMessage | SubmitGraphMessage | AbortMessage | LoraLoadMessage | LoraUnloadMessage | CloseMessage | ExitNowMessage;

// ------------------------------------------------------------ engine -> main

interface LoadProgressMessage {
  kind: "load-progress";
  done: number;
  total: number;
}

interface ThreadReadyMessage {
  kind: "ready";
  ready: ReadyMessage;
  /** Every model worker's process id, by rank. */
  pids: number[];
  /** The engine core's configuration as built from Ready. */
  config: EngineConfig;
}

interface StartFailedMessage {
  kind: "start-failed";
  /** The model worker could not start (its own explanation), or the engine core could not. */
  stage: "worker" | "engine";
  message: string;
  exit: WorkerExit | null;
}

/** One step's timings as the engine thread measured them (benchmarks: recordSteps). */
export interface StepRecord {
  stepId: number;
  /** From one executeStep call to the next (ms); NaN for the last step of a run. */
  stepMs: number;
  encodeMs: number;
  decodeMs: number;
  /** Packing and posting this step's outputs to the main thread. */
  postMs: number;
  /** Steps in flight right after this one was sent, itself included (2 with overlap). */
  inFlight: number;
  /** Sampled tokens the step produced. */
  tokens: number;
  /** The worker's own time (prepare + forward + sample). */
  workerMs: number;
}

export interface OutputsMessage {
  kind: "outputs";
  /** The engine's output batches since the last message, in order (their packed arrays are transferred). */
  outputs: OutputBatch[];
  /** The engine after these outputs. */
  stats: EngineStats;
  /** Submit messages the engine has taken so far (to count the ones still on their way). */
  numSubmitsTaken: number;
  /** Steps completed since the last message (the engine's timing ring). */
  timings: StepTiming[];
  /** With recordSteps. */
  records: StepRecord[];
  /** A graph of models' part; null for a plain LLM. */
  graph: GraphOutputs | null;
}

interface GraphOutputs {
  /** Graph requests' events, in order (chunk bytes are transferred). */
  events: { id: RequestId; event: GraphEvent }[];
  nodes: NodeStats[];
  nodeSteps: NodeStepSample[];
  heldTensors: number;
}

/** A worker died, came back, or will not come back. */
interface WorkerEventMessage {
  kind: "worker-event";
  event: WorkerHealthEvent;
}

/** The engine thread failed itself (a bug): every request has ended with an error. */
interface ThreadFailedMessage {
  kind: "thread-failed";
  message: string;
}

interface ClosedMessage {
  kind: "closed";
}

/** A lora-load's answer: error null when every worker of the model has the adapter. */
interface LoraLoadedMessage {
  kind: "lora-loaded";
  callId: number;
  error: string | null;
}

export type EngineToMainMessage =
  | LoadProgressMessage
  | ThreadReadyMessage
  | StartFailedMessage
  | OutputsMessage
  | WorkerEventMessage
  | ThreadFailedMessage
  | LoraLoadedMessage
  | ClosedMessage;
