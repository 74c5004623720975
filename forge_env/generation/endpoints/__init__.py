"""Generators over model endpoints that live outside this process.

``CompletionsGenerator`` is token level: it sends token-id prompts to an OpenAI-compatible ``/v1/completions``
(vLLM's server) and gets the sampled token ids and their logprobs back, so trajectories stay token-exact.
``ChatEndpoint`` is message level: ``/v1/chat/completions`` through the ``openai`` SDK, for hosted models;
its episodes are for evaluation only (no tokens, no loss mask). Both share ``EndpointConfig``: bounded
concurrency, timeouts, and retries with backoff on 429/5xx/connection errors; a request that still fails
raises ``EndpointError``, which the rollout loop records as an endpoint error (never as a reward of 0).
"""

from forge_env.generation.endpoints.config import EndpointConfig, EndpointError, EndpointStats

__all__ = ["ChatEndpoint", "ChatTurn", "CompletionsGenerator", "EndpointConfig", "EndpointError", "EndpointStats"]


def __getattr__(name: str):
    if name == "CompletionsGenerator":
        from forge_env.generation.endpoints.completions import CompletionsGenerator

        return CompletionsGenerator
    if name in ("ChatEndpoint", "ChatTurn"):
        from forge_env.generation.endpoints import chat

        return getattr(chat, name)
    raise AttributeError(f"module 'forge_env.generation.endpoints' has no attribute {name!r}")
