// Errors in the OpenAI shape: {"error": {"message", "type", "param", "code"}}.
// Handlers throw ApiError; the server's error handler turns it (and fastify's
// own errors, such as invalid JSON) into this body.

export type ApiErrorType = "invalid_request_error" | "not_found_error" | "server_error" | "service_unavailable";

export interface OpenAIErrorBody {
  error: {
    message: string;
    type: ApiErrorType;
    param: string | null;
    code: string | number | null;
  };
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: ApiErrorType,
    readonly param: string | null = null,
    readonly code: string | null = null,
  ) {
    super(message);
    this.name = "ApiError";
  }

  toBody(): OpenAIErrorBody {
    return { error: { message: this.message, type: this.type, param: this.param, code: this.code } };
  }
}

export function badRequest(message: string, param: string | null = null, code: string | null = null): ApiError {
  return new ApiError(400, message, "invalid_request_error", param, code);
}

export function modelNotFound(requested: string, served: string): ApiError {
  return new ApiError(
    404,
    `The model \`${requested}\` does not exist. This server serves \`${served}\`.`,
    "not_found_error",
    "model",
    "model_not_found",
  );
}

export function serviceUnavailable(message: string): ApiError {
  return new ApiError(503, message, "service_unavailable", null, null);
}

export function serverError(message: string): ApiError {
  return new ApiError(500, message, "server_error", null, null);
}
