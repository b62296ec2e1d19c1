"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`, with the HTTP status.

Messages say what is wrong and how to fix it; none quotes an API key, a secret or a prompt.
"""

from __future__ import annotations

from typing import Final

import msgspec

INVALID_REQUEST: Final = "invalid_request_error"
AUTHENTICATION: Final = "authentication_error"
SERVER: Final = "server_error"
_encoder = msgspec.json.Encoder()


class ApiError(Exception):
    """A request the gateway refuses or cannot serve: `status` and `body()` are what the client receives."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str,
        code: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def body(self) -> bytes:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return _encoder.encode({"error": error})

    def sse_event(self) -> bytes:
        """The error as one server-sent event, for a stream whose headers have already gone out."""
        return b"data: " + self.body() + b"\n\n"


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> ApiError:
    return ApiError(400, message, type=INVALID_REQUEST, code=code, param=param)


def missing_api_key() -> ApiError:
    return ApiError(
        401,
        "No API key provided: send it as 'Authorization: Bearer <key>'.",
        type=AUTHENTICATION,
        code="missing_api_key",
    )


def invalid_api_key() -> ApiError:
    return ApiError(401, "The API key provided is not valid.", type=AUTHENTICATION, code="invalid_api_key")


def unknown_model(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model {model!r} does not exist here; GET /v1/models lists the models served.",
        type=INVALID_REQUEST,
        code="model_not_found",
        param="model",
    )


def body_too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"The request body exceeds the gateway's limit of {limit} bytes.",
        type=INVALID_REQUEST,
        code="request_too_large",
    )


def unsupported_media_type() -> ApiError:
    return ApiError(
        415,
        "The request body must be sent as 'Content-Type: application/json'.",
        type=INVALID_REQUEST,
        code="unsupported_media_type",
    )


def rate_limited(retry_after_s: int) -> ApiError:
    return ApiError(
        429,
        f"Too many requests for this tenant: retry in {retry_after_s} s.",
        type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after_s)},
    )


def no_ready_replica(model: str) -> ApiError:
    return ApiError(
        503,
        f"No replica of {model!r} is ready to serve; retry shortly.",
        type=SERVER,
        code="no_ready_replica",
    )


def upstream_failed(what: str) -> ApiError:
    return ApiError(502, f"The model replica failed: {what}.", type=SERVER, code="upstream_error")


def upstream_timeout() -> ApiError:
    return ApiError(
        504,
        "The model replica did not answer within the gateway's timeout.",
        type=SERVER,
        code="upstream_timeout",
    )
