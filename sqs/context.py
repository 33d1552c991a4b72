"""What every SQS action works with: who calls (:class:`Context`), how queue names, URLs and
ARNs are spelled, the call's parameters read and checked, and the service's exceptions as
SQS's errors.

A queue name ``x.fifo`` is the strict queue ``x-fifo`` of the service (its names have no dots);
the REST API sees that name. A queue URL is ``<base_url>/<region>/<account>/<name>``; only its
last part counts (any host).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from django.core.exceptions import ValidationError
from django.db import DatabaseError

from queues import service
from queues.access import Caller
from queues.service.types import QueueConfig
from sqs.errors import SQSError

FIFO_SUFFIX = ".fifo"
#: the service's name of a FIFO queue ends so (its names have no dots).
SERVICE_FIFO_SUFFIX = "-fifo"


@dataclass(frozen=True)
class Context:
    """Who calls, and how queue URLs and ARNs are spelled for them."""

    caller: Caller
    #: ``http://<host>/sqs``: queue URLs are ``<base_url>/<region>/<account>/<name>``.
    base_url: str
    account: str
    #: the node's region (``SQS_REGION``), else the one the call is signed for.
    region: str
    #: the caller's SenderId: an opaque ID of its user (never a credential of theirs).
    sender_id: str = ""
    #: the request's ``X-Amzn-Trace-Id`` header: the AWSTraceHeader of every message it sends.
    trace_header: str = ""


# --- names, URLs, ARNs --------------------------------------------------------------------------
def service_name(sqs_name: str) -> str:
    if sqs_name.endswith(FIFO_SUFFIX):
        return sqs_name[: -len(FIFO_SUFFIX)] + SERVICE_FIFO_SUFFIX
    return sqs_name


def sqs_name(name: str, strict: bool) -> str:
    if strict and name.endswith(SERVICE_FIFO_SUFFIX):
        return name[: -len(SERVICE_FIFO_SUFFIX)] + FIFO_SUFFIX
    return name


def queue_url(ctx: Context, name: str, strict: bool) -> str:
    return f"{ctx.base_url}/{ctx.region}/{ctx.account}/{sqs_name(name, strict)}"


def queue_arn(ctx: Context, name: str, strict: bool) -> str:
    return f"arn:aws:sqs:{ctx.region}:{ctx.account}:{sqs_name(name, strict)}"


# --- errors -------------------------------------------------------------------------------------
def missing(name: str) -> SQSError:
    return SQSError("MissingParameter", f"The request must contain the parameter {name}.")


def invalid(message: str) -> SQSError:
    return SQSError("InvalidParameterValue", message)


def no_queue() -> SQSError:
    return SQSError("QueueDoesNotExist", "The specified queue does not exist.")


def _by_status(exc: service.ServiceError) -> SQSError:
    """A service error in SQS's terms by its status (another node's answer passed on, and any
    error :data:`_AWS_ERRORS` does not name)."""
    if exc.status == 404:
        return no_queue()
    if exc.status == 403:
        return SQSError("AccessDenied", exc.detail)
    if exc.status == 409:
        return SQSError("ReceiptHandleIsInvalid", exc.detail)
    if exc.status == 429:  # SQS's throttling error, which SDKs back off from
        return SQSError("RequestThrottled", exc.detail, retry_after=exc.retry_after or 1)
    if exc.status < 500:
        return invalid(exc.detail)
    return SQSError("ServiceUnavailable", exc.detail, retry_after=1)


#: The service errors whose SQS answer is not the one of their status, by class (the nearest
#: class in an error's MRO counts). None: a bug of this node's, answered InternalFailure.
_AWS_ERRORS: dict[type[service.ServiceError], Callable[[Any], SQSError | None]] = {
    SQSError: lambda exc: exc,  # SQS's own (a signature's, the query codec's too)
    service.Fault: lambda exc: None,
    # 404 for the path's resource in the REST API; a parameter's value here.
    service.InvalidRequest: lambda exc: invalid(exc.detail),
    service.ReceiptMismatch: lambda exc: SQSError(
        "ReceiptHandleIsInvalid", f"The receipt handle is not valid now: {exc}"
    ),
    # SQS has no conflict of state; the calls that meet one (a partition no live node holds)
    # may succeed on a retry.
    service.Conflict: lambda exc: SQSError("ServiceUnavailable", f"{exc.detail}; retry", retry_after=1),
    service.Unavailable: lambda exc: SQSError("ServiceUnavailable", f"unavailable now, retry: {exc}", retry_after=1),
}


def sqs_error(exc: BaseException) -> SQSError | None:
    """``exc`` in SQS's terms: the one place an exception becomes an SQS error (the actions'
    :func:`service_errors` and the endpoint's answer both ask here). None for a bug (a
    :class:`~queues.errors.Fault`, or no error of the service's): answered InternalFailure."""
    if isinstance(exc, service.ServiceError):
        for cls in type(exc).__mro__:
            if cls in _AWS_ERRORS:
                return _AWS_ERRORS[cls](exc)
        return _by_status(exc)
    if isinstance(exc, ValidationError):  # a model's full_clean
        return SQSError("InvalidAttributeValue", "; ".join(exc.messages))
    if isinstance(exc, DatabaseError):
        return SQSError("ServiceUnavailable", f"unavailable now, retry: {exc}", retry_after=1)
    return None


class _ServiceErrors:
    """``with service_errors():`` the service's exceptions raised as SQS's errors
    (:func:`sqs_error`); a bug as it is. A class, not a generator: every action enters one."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is None or not isinstance(exc, Exception):
            return False
        mapped = sqs_error(exc)
        if mapped is None or mapped is exc:
            return False
        raise mapped from None


_SERVICE_ERRORS = _ServiceErrors()


def service_errors() -> _ServiceErrors:
    """The service's exceptions raised as SQS's errors (:func:`sqs_error`); a bug as it is."""
    return _SERVICE_ERRORS


# --- parameters ---------------------------------------------------------------------------------
def text_param(params: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = params.get(name)
    if value is None:
        if required:
            raise missing(name)
        return None
    if not isinstance(value, str):
        raise invalid(f"{name} must be a string")
    return value


#: the most digits an integer parameter is read with (leading zeros aside): more are past every
#: range (the widest, a long's, has 19), and past 4,300 Python refuses to convert them.
_MAX_DIGITS = 32
_DIGITS = re.compile(r"-?[0-9]+")


def integer_of(value: Any) -> int | None:
    """``value`` as an integer parameter, else None: an ``int`` (not a bool), or text of ASCII
    digits with an optional ``-`` and spaces around (other digits, such as ``²`` or ``٣``, are
    not SQS's). Text of more than ``_MAX_DIGITS`` digits is None (past every range) and never
    converted."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if _DIGITS.fullmatch(text) and len(text.lstrip("-").lstrip("0")) <= _MAX_DIGITS:
            return int(text)
    return None


def shown(value: Any, limit: int = 64) -> str:
    """``value`` as an error message quotes it: at most ``limit`` characters (a caller's value
    may be a megabyte of text, or an integer of thousands of digits)."""
    try:
        text = str(value)
    except ValueError:  # an int past Python's digit limit for conversion to text
        text = f"an integer of {value.bit_length()} bits"
    return text if len(text) <= limit else f"{text[:limit]}..."


def integer_param(params: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """Parameter ``name``, an integer from ``low`` to ``high`` (:func:`integer_of`), or None if
    it is not given. Raises InvalidParameterValue."""
    value = params.get(name)
    if value is None:
        return None
    number = integer_of(value)
    if number is None or not low <= number <= high:
        raise invalid(
            f"Value {shown(value)} for parameter {name} is invalid. Reason: must be between {low} and {high}."
        )
    return number


def queue_param(params: dict[str, Any], ctx: Context) -> Any:
    """The queue row named by ``QueueUrl`` (any host: only the name counts), if readable."""
    url = text_param(params, "QueueUrl", required=True)
    assert url is not None
    name = url.rstrip("/").rsplit("/", 1)[-1]
    with service_errors():
        try:
            q = service.get_queue(service_name(name), caller=ctx.caller)
        except service.QueueNotFound:
            raise no_queue() from None
    if name.endswith(FIFO_SUFFIX) and not q.strict:
        raise no_queue()
    return q


def message_queue_param(params: dict[str, Any], ctx: Context) -> QueueConfig:
    """As :func:`queue_param`, for the message actions: the queue's description as this node
    serves it (``service.authorize``, as the REST API's message calls read it: no query), not
    its row."""
    url = text_param(params, "QueueUrl", required=True)
    assert url is not None
    name = url.rstrip("/").rsplit("/", 1)[-1]
    with service_errors():
        try:
            cfg, _ = service.authorize(service_name(name), "read", caller=ctx.caller)
        except service.QueueNotFound:
            raise no_queue() from None
    if cfg.kind != "queue" or (name.endswith(FIFO_SUFFIX) and not cfg.strict):
        raise no_queue()
    return cfg
