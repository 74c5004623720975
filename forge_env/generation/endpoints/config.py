"""Settings, errors and the retry policy shared by the endpoint generators."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from forge_env.errors import InfraError
from forge_env.generation.base import GenerationError

T = TypeVar("T")

#: HTTP statuses worth retrying: rate limits and server-side failures (a 4xx other than 408/409/429 is our bug).
RETRYABLE_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class EndpointError(GenerationError, InfraError):
    """A model endpoint failed after all retries (or refused the request outright).

    A failure of the machine (an :class:`~forge_env.errors.InfraError`, still a ``GenerationError``), with its
    own accounting: the rollout loop marks the episode ``status="error"`` with ``error_kind="endpoint"``: the
    model was never asked, so the episode must not count as a model failure (evaluation counts these apart).
    ``retries`` is how many retries were spent.
    """

    error_kind = "endpoint"

    def __init__(self, message: str, *, status: int | None = None, retries: int = 0, retryable: bool = True):
        super().__init__(message)
        self.status = status
        self.retries = retries
        self.retryable = retryable


class RetryableEndpointError(EndpointError):
    """One attempt failed in a way that a later attempt may not (429, 5xx, timeout, connection refused)."""


@dataclass
class EndpointConfig:
    """Where the model is and how patiently to talk to it.

    ``api_key`` defaults to the value of the environment variable ``api_key_env`` (never put keys in configs
    or on the command line). ``timeout_s`` bounds one whole request, from connecting to the last byte of the answer
    (a server that drips its answer cannot stretch it); ``max_response_bytes`` bounds the answer's size. A
    ``Retry-After`` header is not obeyed past ``max_backoff_s``: a server cannot park the run. ``session_header`` carries the episode's session id on every request, so a
    router keeps an episode on one replica (and its KV cache); ``None`` sends no header.
    """

    base_url: str
    model: str
    api_key: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    max_retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_concurrency: int = 32
    max_response_bytes: int = 32 * 1024 * 1024
    session_header: str | None = "X-Session-ID"
    extra_headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.base_url:
            raise ValueError("EndpointConfig.base_url is empty; pass the server's URL, e.g. http://127.0.0.1:8000/v1")
        self.base_url = self.base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        if self.max_retries < 0 or self.max_concurrency < 1 or self.timeout_s <= 0 or self.max_response_bytes < 1:
            raise ValueError("max_retries must be >= 0, max_concurrency >= 1, timeout_s > 0 and "
                             "max_response_bytes >= 1")

    def resolved_api_key(self) -> str | None:
        return self.api_key or os.environ.get(self.api_key_env) or None

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (1-based): exponential with full jitter, capped."""
        return random.uniform(0.5, 1.0) * min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))


@dataclass
class EndpointStats:
    """Counters of one endpoint client: requests sent, retries spent, requests that failed for good."""

    requests: int = 0
    retries: int = 0
    failures: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "retries": self.retries, "failures": self.failures}


async def call_with_retries(attempt: Callable[[], Awaitable[T]], config: EndpointConfig, stats: EndpointStats,
                            what: str) -> tuple[T, int]:
    """Run ``attempt`` until it succeeds; retry ``RetryableEndpointError`` with backoff up to ``max_retries``.

    Each attempt gets ``config.timeout_s`` in all (the HTTP clients' own timeouts are per read, which a server
    sending a byte at a time never trips). Returns ``(result, retries spent)``; raises ``EndpointError`` (carrying the retries) when it gives up.
    """
    retries = 0
    while True:
        stats.requests += 1
        try:
            return await _within(attempt, config.timeout_s), retries
        except RetryableEndpointError as exc:
            if retries >= config.max_retries:
                stats.failures += 1
                raise EndpointError(f"{what} failed after {retries + 1} attempts: {exc}", status=exc.status,
                                    retries=retries) from exc
            retries += 1
            stats.retries += 1
            await asyncio.sleep(config.backoff(retries))
        except EndpointError as exc:
            stats.failures += 1
            exc.retries = retries
            raise


async def _within(attempt: Callable[[], Awaitable[T]], timeout_s: float) -> T:
    try:
        return await asyncio.wait_for(attempt(), timeout_s)
    except TimeoutError:
        raise RetryableEndpointError(f"no complete answer within {timeout_s:g} s (EndpointConfig.timeout_s)") from None
