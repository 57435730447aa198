// Audio bytes as clients receive them from /v1/audio/speech: `pcm` is the
// model's raw s16le samples; `wav` is the same samples behind a RIFF header.
// Speech streams before its length is known, so a streamed WAV header says
// "unknown size" with 0xFFFFFFFF in both size fields, as ffmpeg writes WAV to
// a pipe; decoders then read the data chunk to the end of the stream.

export interface PcmFormat {
  sampleRate: number;
  channels: number;
  /** Bits per sample of signed little-endian PCM. */
  bitsPerSample: 16;
}

export const UNKNOWN_SIZE = 0xffffffff;

/** The 44-byte RIFF/WAVE header; dataBytes null when the length is not known yet. */
export function wavHeader(format: PcmFormat, dataBytes: number | null): Buffer {
  const header = Buffer.alloc(44);
  const blockAlign = format.channels * (format.bitsPerSample / 8);
  const riffSize = dataBytes === null ? UNKNOWN_SIZE : 36 + dataBytes;
  header.write("RIFF", 0, "ascii");
  header.writeUInt32LE(riffSize, 4);
  header.write("WAVE", 8, "ascii");
  header.write("fmt ", 12, "ascii");
  header.writeUInt32LE(16, 16); // fmt chunk size
  header.writeUInt16LE(1, 20); // PCM
  header.writeUInt16LE(format.channels, 22);
  header.writeUInt32LE(format.sampleRate, 24);
  header.writeUInt32LE(format.sampleRate * blockAlign, 28);
  header.writeUInt16LE(blockAlign, 32);
  header.writeUInt16LE(format.bitsPerSample, 34);
  header.write("data", 36, "ascii");
  header.writeUInt32LE(dataBytes === null ? UNKNOWN_SIZE : dataBytes, 40);
  return header;
}

export const SPEECH_FORMATS = ["pcm", "wav"] as const;
export type SpeechFormat = (typeof SPEECH_FORMATS)[number];

export const SPEECH_CONTENT_TYPES: Record<SpeechFormat, string> = {
  pcm: "audio/pcm",
  wav: "audio/wav",
};
