"""Token-level generation over an OpenAI-compatible ``/v1/completions`` that takes token-id prompts.

vLLM's server does: the prompt goes as a list of token ids, ``return_token_ids`` brings the sampled ids back
verbatim, and ``logprobs=0`` with ``return_tokens_as_token_ids`` gives the sampler's logprob of each sampled
token. The server must be started with ``--logprobs-mode processed_logprobs`` for those logprobs to be the
ones of the temperature/top-k/top-p distribution that was actually sampled (the default reports the raw
model's). Every request of an episode carries the episode's session id in ``session_header``
(``X-Session-ID``), so a router in front of several replicas keeps the episode on one replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from forge_env.generation.base import Completion, GeneratorClosedError, SamplingParams, WeightUpdateError
from forge_env.generation.endpoints.config import (
    RETRYABLE_STATUSES,
    EndpointConfig,
    EndpointError,
    EndpointStats,
    RetryableEndpointError,
    call_with_retries,
)
from forge_env.generation.endpoints.responses import json_body, parse_completion, read_capped

__all__ = ["CompletionsGenerator", "parse_completion"]


class CompletionsGenerator:
    """A ``Generator`` whose model runs behind ``config.base_url`` (token ids in, token ids + logprobs out).

    The weights are the server's: ``policy_version`` is the fixed ``policy_version`` given here, and
    ``update_weights`` refuses (reload the server instead). ``vocab_size``: the tokenizer's (``len(tokenizer)``);
    a token id outside it is an endpoint error, so no trajectory holds tokens the tokenizer cannot decode.
    """

    def __init__(self, config: EndpointConfig, *, policy_version: int = 0, vocab_size: int | None = None) -> None:
        import httpx

        self.config = config
        self.stats = EndpointStats()
        self._version = policy_version
        self.vocab_size = vocab_size
        self._limit = asyncio.Semaphore(config.max_concurrency)
        headers = {"Content-Type": "application/json", **config.extra_headers}
        if (key := config.resolved_api_key()) is not None:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.AsyncClient(
            base_url=config.base_url, headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(max_connections=config.max_concurrency))
        self._closed = False

    @property
    def policy_version(self) -> int:
        return self._version

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams | None = None,
                       session_id: str | None = None) -> Completion:
        """One completion of ``prompt_ids``; raises ``EndpointError`` when the endpoint fails for good."""
        if self._closed:
            raise GeneratorClosedError("this CompletionsGenerator was closed; create a new one")
        sampling = sampling or SamplingParams()
        if sampling.n != 1:
            raise ValueError("generate() returns one completion; ask for n > 1 with several calls")
        body = self._request_body(list(prompt_ids), sampling)
        headers = {}
        if session_id is not None and self.config.session_header:
            headers[self.config.session_header] = session_id
        async with self._limit:
            data, retries = await call_with_retries(lambda: self._post(body, headers), self.config, self.stats,
                                                    f"POST {self.config.base_url}/completions")
        completion = parse_completion(data, list(prompt_ids), self._version, vocab_size=self.vocab_size,
                                      max_tokens=sampling.max_tokens)
        completion.metrics["retries"] = float(retries)
        return completion

    async def generate_n(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> list[Completion]:
        """``sampling.n`` independent completions of one prompt (seeds ``seed, seed + 1, ...``), concurrently."""
        return list(await asyncio.gather(*(self.generate(prompt_ids, sampling.for_sample(i))
                                           for i in range(sampling.n))))

    def _request_body(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model, "prompt": prompt_ids, "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p, "n": 1,
            "logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True,
            "skip_special_tokens": True, "ignore_eos": sampling.ignore_eos,
            "include_stop_str_in_output": sampling.include_stop_str_in_output,
        }
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        return body

    async def _post(self, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        import httpx

        try:
            async with self._client.stream("POST", "/completions", json=body, headers=headers) as response:
                raw = await read_capped(response.aiter_bytes(), self.config.max_response_bytes)
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            raise RetryableEndpointError(f"{type(exc).__name__}: {exc or 'no response'}") from exc
        text = raw[:500].decode("utf-8", "replace")
        if response.status_code in RETRYABLE_STATUSES:
            raise RetryableEndpointError(f"HTTP {response.status_code}: {text[:200]}", status=response.status_code)
        if response.status_code != 200:
            raise EndpointError(f"HTTP {response.status_code}: {text}", status=response.status_code, retryable=False)
        return json_body(raw)

    async def update_weights(self, version: int) -> None:
        raise WeightUpdateError("the weights of a model endpoint belong to its server; restart or reload the server")

    async def release_session(self, session_id: str) -> None:
        """Nothing to release: the server's prefix cache manages itself."""

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._client.aclose()
