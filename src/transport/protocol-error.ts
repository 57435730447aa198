// Hand-written: messages.ts is generated and re-exports this.

/** A message that does not match the schema; `field` names where decoding stopped. */
export class ProtocolError extends Error {
  constructor(
    message: string,
    readonly field: string,
  ) {
    super(message);
    this.name = "ProtocolError";
  }
}
