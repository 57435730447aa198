// What flows along edges in the conductor (graph contract, "Values"). The
// conductor never looks inside a tensor: it routes descriptors and tells the
// owning worker when the control plane no longer refers to one.

export interface TensorValue {
  readonly kind: "tensor";
  /** The tensor's id in its owner's tensor store. */
  readonly handle: number;
  /** The worker holding the bytes. */
  readonly worker: number;
  readonly dtype: string;
  readonly shape: readonly number[];
  /** Where the owner published the bytes for workers of other ranks; null when only the owner uses them. */
  readonly shm: SharedBlock | null;
}

/** A block of the owner's shared-memory arena: `nbytes` bytes at `offset` of the file `segment` under /dev/shm. */
interface SharedBlock {
  readonly segment: string;
  readonly offset: number;
  readonly nbytes: number;
}

/** Sampled ids (from kv_cache nodes) and prompt ids, which the control plane has anyway. */
export interface TokensValue {
  readonly kind: "tokens";
  readonly ids: Int32Array;
}

/**
 * An output already rendered for the client by the worker (the model's
 * postprocess): bytes that only a client route uses; tensor routes skip it.
 */
interface BytesValue {
  readonly kind: "bytes";
  readonly modality: string;
  readonly data: Uint8Array;
  readonly metadata: Readonly<Record<string, unknown>>;
}

/** A declared output that was not produced: a signal. */
interface EmptyValue {
  readonly kind: "empty";
}

export type Value = TensorValue | TokensValue | BytesValue | EmptyValue;

/** An edge delivery: a list of values, possibly empty (a signal). */
export type Values = readonly Value[];

export const NO_VALUES: Values = Object.freeze([]);
