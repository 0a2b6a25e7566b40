"""Why admission refuses a request (:class:`AdmissionError` and its kinds): each carries the HTTP status, the
``reason`` the error body and the metrics name, and how long a client should wait before trying again."""

from __future__ import annotations


class AdmissionError(Exception):
    """A request the gateway refuses; carries what the HTTP layer needs to answer it."""

    status = 503
    reason = "rejected"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFull(AdmissionError):
    status = 429
    reason = "queue_full"


class QueueBytesFull(AdmissionError):
    status = 429
    reason = "queue_bytes_full"


class TenantQueueFull(AdmissionError):
    status = 429
    reason = "tenant_queue_full"


class QuotaExceeded(AdmissionError):
    status = 429
    reason = "quota_exceeded"


class QueueTimeout(AdmissionError):
    status = 503
    reason = "queue_timeout"


class NoHealthyUpstream(AdmissionError):
    status = 503
    reason = "no_upstream"


class ShuttingDown(AdmissionError):
    status = 503
    reason = "shutting_down"
