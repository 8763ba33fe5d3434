"""The typed error hierarchy of the core.

Every error the core raises on purpose is a :class:`FastVideoError`. Each class carries the
gRPC status name it maps to; the mapping to real gRPC codes happens once, at the service edge
(``services/common``), and the CLI maps them to exit codes. Errors are plain data so they can be
put on the wire (``fastvideo3.v1.Error``) and rebuilt on the other side with :func:`from_code`.
"""
from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any


class FastVideoError(Exception):
    """Base of every typed error. ``field`` and ``limit`` name what was wrong and what is allowed."""

    code = "INTERNAL"

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        limit: str | None = None,
        retry_after_s: float | None = None,
        request_id: str | None = None,
        step: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.request_id = request_id
        self.step = step
        self.details = dict(details or {})

    def one_line(self) -> str:
        """The single line shown to a user: field, message and the allowed range."""
        head = f"{self.field}: " if self.field else ""
        tail = f" (allowed: {self.limit})" if self.limit else ""
        retry = f" (retry after {self.retry_after_s:.1f}s)" if self.retry_after_s else ""
        return f"{self.code}: {head}{self.message}{tail}{retry}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "field": self.field,
            "limit": self.limit,
            "retry_after_s": self.retry_after_s,
            "request_id": self.request_id,
            "step": self.step,
            "details": self.details,
        }

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.one_line()


def _kind(name: str, code: str | None, doc: str | None,
          base: type[FastVideoError] = FastVideoError) -> type[FastVideoError]:
    """A subclass of ``base`` named ``name``; ``code`` of None keeps the base's status name."""
    body: dict[str, Any] = {"__doc__": doc, "__module__": __name__, "__qualname__": name}
    if code is not None:
        body["code"] = code
    return type(name, (base,), body)


InvalidRequest = _kind("InvalidRequest", "INVALID_ARGUMENT",
                       "Bad user input: a field outside its allowed range.")
FailedPrecondition = _kind("FailedPrecondition", "FAILED_PRECONDITION",
                           "The request is well formed but cannot run in the current configuration.")
RecipeMismatch = _kind("RecipeMismatch", None, "A request asks for a loop / step count / precision "
                       "the card's recipe does not allow.", FailedPrecondition)
CardError = _kind("CardError", None, "A model card (or the directory it points at) is invalid or "
                  "disagrees with its checkpoint.", InvalidRequest)
NotFound = _kind("NotFound", "NOT_FOUND", None)
ResourceExhausted = _kind("ResourceExhausted", "RESOURCE_EXHAUSTED", "No budget, no memory or a full "
                          "queue. Carries ``retry_after_s`` when one is known.")
AlreadyExists = _kind("AlreadyExists", "ALREADY_EXISTS",
                      "The request id is taken by a live or retained request with other parameters.")
Cancelled = _kind("Cancelled", "CANCELLED", None)
Unavailable = _kind("Unavailable", "UNAVAILABLE", "A pool, store or transport peer is gone or not serving.")
DataLoss = _kind("DataLoss", "DATA_LOSS", "A transfer arrived corrupted (checksum mismatch).")
DeadlineExceeded = _kind("DeadlineExceeded", "DEADLINE_EXCEEDED", None)
NumericFault = _kind("NumericFault", "ABORTED",
                     "A request-fatal numeric fault (non-finite latents). Aborts that request only.")
Internal = _kind("Internal", "INTERNAL", None)
Unauthenticated = _kind("Unauthenticated", "UNAUTHENTICATED",
                        "The call carried no valid credentials (token auth is on).")

_BY_CODE: dict[str, type[FastVideoError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        FailedPrecondition,
        NotFound,
        ResourceExhausted,
        AlreadyExists,
        Cancelled,
        Unavailable,
        DataLoss,
        DeadlineExceeded,
        NumericFault,
        Internal,
        Unauthenticated,
    )
}


def from_code(code: str, message: str, **kw: Any) -> FastVideoError:
    """Rebuild a typed error from its status name (e.g. after it crossed the wire)."""
    return _BY_CODE.get(code, Internal)(message, **kw)


#: ``details`` keys of a request's terminal error that say what was lost and what to do; on the
#: wire they are typed fields of ``fastvideo3.v1.Error`` (``retryable``, ``resume_from_step``,
#: ``loss``), see :func:`loss_report`.
LOSS_KEYS = ("retryable", "resume_from_step", "lost_role", "lost_replica", "step_reached", "checkpoint")


def loss_report(*, retryable: bool, resume_from_step: int | None = None, role: str | None = None,
                replica: str | None = None, step_reached: int | None = None,
                checkpoint: bool | None = None) -> dict[str, Any]:
    """The ``details`` entries of a terminal error: whether the same request sent again can
    succeed, the step it would continue from, and which role / replica died at which step."""
    out: dict[str, Any] = {"retryable": bool(retryable)}
    if resume_from_step is not None:
        out["resume_from_step"] = int(resume_from_step)
    if role:
        out["lost_role"] = role
    if replica:
        out["lost_replica"] = replica
    if step_reached is not None:
        out["step_reached"] = int(step_reached)
    if checkpoint is not None:
        out["checkpoint"] = bool(checkpoint)
    return out


@dataclass(frozen=True)
class ErrorInfo:
    """Plain-data form of an error, as carried in events and StepResults."""

    code: str
    message: str
    field: str | None = None
    limit: str | None = None
    step: int | None = None
    retry_after_s: float | None = None
    details: dict[str, Any] = dc_field(default_factory=dict)

    @classmethod
    def of(cls, exc: BaseException) -> "ErrorInfo":
        if isinstance(exc, FastVideoError):
            return cls(exc.code, exc.message, exc.field, exc.limit, exc.step, exc.retry_after_s, exc.details)
        return cls("INTERNAL", f"{type(exc).__name__}: {exc}")

    def to_exception(self) -> FastVideoError:
        return from_code(
            self.code, self.message, field=self.field, limit=self.limit, step=self.step,
            retry_after_s=self.retry_after_s, details=self.details,
        )
