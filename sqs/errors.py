"""SQS's errors: one exception, and each code's status, fault and query-protocol code."""

from __future__ import annotations

from queues.errors import ServiceError

#: JSON-protocol code (the error shape's name) -> (query-protocol code, HTTP status, sender's fault).
#: The query code is what the query protocol answers in ``<Code>`` and the JSON protocol in the
#: ``x-amzn-query-error`` header (botocore raises the modelled exception from it).
CODES: dict[str, tuple[str, int, bool]] = {
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400, True),
    "QueueNameExists": ("QueueAlreadyExists", 400, True),
    "QueueDeletedRecently": ("AWS.SimpleQueueService.QueueDeletedRecently", 400, True),
    "PurgeQueueInProgress": ("AWS.SimpleQueueService.PurgeQueueInProgress", 403, True),
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400, True),
    "TooManyEntriesInBatchRequest": ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400, True),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400, True),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400, True),
    "BatchRequestTooLong": ("AWS.SimpleQueueService.BatchRequestTooLong", 400, True),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400, True),
    "MessageNotInflight": ("AWS.SimpleQueueService.MessageNotInflight", 400, True),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 404, True),
    "InvalidAttributeName": ("InvalidAttributeName", 400, True),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400, True),
    "InvalidMessageContents": ("InvalidMessageContents", 400, True),
    "InvalidIdFormat": ("InvalidIdFormat", 400, True),
    "OverLimit": ("OverLimit", 403, True),
    "ResourceNotFoundException": ("ResourceNotFoundException", 404, True),
    "RequestThrottled": ("RequestThrottled", 400, True),
    "InvalidParameterValue": ("InvalidParameterValue", 400, True),
    "MissingParameter": ("MissingParameter", 400, True),
    "InvalidAction": ("InvalidAction", 400, True),
    "AccessDenied": ("AccessDenied", 403, True),
    "InvalidClientTokenId": ("InvalidClientTokenId", 403, True),
    "SignatureDoesNotMatch": ("SignatureDoesNotMatch", 403, True),
    "IncompleteSignature": ("IncompleteSignature", 400, True),
    "MissingAuthenticationToken": ("MissingAuthenticationToken", 403, True),
    "RequestExpired": ("RequestExpired", 400, True),
    "MalformedQueryString": ("MalformedQueryString", 400, True),
    "ServiceUnavailable": ("ServiceUnavailable", 503, False),
    "InternalFailure": ("InternalFailure", 500, False),
}


class SQSError(ServiceError):
    """A refusal in SQS's terms. ``code`` is the JSON protocol's (the error shape's name);
    ``query_code`` the query protocol's; ``detail`` the message. ``retry_after`` (seconds) goes
    out as Retry-After."""

    def __init__(
        self,
        code: str,
        message: str,
        status: int | None = None,
        sender_fault: bool | None = None,
        *,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        query_code, default_status, default_fault = CODES.get(code, (code, 400, True))
        self.code = code
        self.query_code = query_code
        self.message = message
        self.status = status if status is not None else default_status
        self.sender_fault = sender_fault if sender_fault is not None else default_fault
        self.retry_after = retry_after

    @property
    def detail(self) -> str:
        return self.message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"
