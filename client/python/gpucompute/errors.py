"""The one exception type of the client."""

from __future__ import annotations

import grpc


class ComputeError(Exception):
    """A failed call: the gRPC status code and the server's message.

    `code` is a grpc.StatusCode (INVALID_ARGUMENT with the field's name in `message` for a
    bad request, DEADLINE_EXCEEDED when the deadline passed, UNAVAILABLE when the server
    cannot be reached, NOT_FOUND for an unknown or freed handle, ...). Arguments the client
    rejects before sending anything raise it too, with INVALID_ARGUMENT.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "ComputeError":
        """The ComputeError of a grpc.RpcError (a grpc.Call, sync or asyncio)."""
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")
