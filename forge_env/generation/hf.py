"""``HFGenerator``: a transformers causal LM behind the ``Generator`` protocol, CPU or GPU.

One worker thread owns the model and runs a continuous-batching loop: requests that arrive while others
are decoding are prefilled and join the running batch at the next step, and every decode step is one
forward pass over all running rows (left-padded KV cache, pad columns masked). Sticky sessions keep each
session's KV cache between turns; a prompt that extends the cached tokens only prefills the new suffix
(a prompt that diverges reuses the common prefix). Idle session caches are LRU-bounded by count and bytes
and are dropped on a weight update unless ``keep_sessions_on_update``.

Callers await asyncio futures from any event loop; the model never runs on the caller's loop.

This module is the facade (configuration, the public API, the caller side, weight loading); the worker
thread's scheduler is :mod:`forge_env.generation.hf_batching` and the sticky-session bookkeeping
:mod:`forge_env.generation.hf_sessions`, both mixed into ``HFGenerator``.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from forge_env.generation.base import (
    Completion,
    GeneratorBase,
    GeneratorClosedError,
    PromptTooLongError,
    SamplingParams,
    WeightSource,
    WeightUpdateError,
)
from forge_env.generation.gqa_attention import use_gqa_attention
from forge_env.generation.hf_batching import BatchRow, ContinuousBatching, ControlCall, PendingRequest
from forge_env.generation.hf_sessions import StickySessions
from forge_env.generation.kv_cache import BatchKV, SessionCacheStore, SessionKV
from forge_env.generation.lora_serving import LoRAServing
from forge_env.generation.sampling import LogprobsMode
from forge_env.weights.adapter import LoRAConfig
from forge_env.weights.adopt import can_adopt_weights, retie_embeddings


@dataclass
class HFGeneratorConfig:
    """Knobs of ``HFGenerator``."""

    max_batch_size: int = 16
    max_sessions: int = 256
    max_session_cache_bytes: int = 4 << 30
    keep_sessions_on_update: bool = False
    logprobs_mode: LogprobsMode = "processed"
    # Long prompts are prefilled in chunks so attention memory stays bounded.
    prefill_chunk_size: int = 2048
    #: Context window; defaults to the model config's ``max_position_embeddings``.
    max_model_len: int | None = None
    #: Keep the keys/values of the last prompt that no session cache covered, and start the next such prompt
    #: from the prefix they share (a system prompt, a task template): fewer tokens to prefill. Dropped on a
    #: weight update. The completions are those of a full prefill up to rounding; ``num_cached_tokens`` then
    #: counts the reused prefix too.
    prompt_prefix_cache: bool = False
    #: The shortest shared prefix worth reusing.
    min_prompt_prefix: int = 16
    #: On CPU, a model with grouped key/value heads and sdpa attention attends without copying the keys and
    #: values per query head (:mod:`forge_env.generation.gqa_attention`; the same output, bit for bit).
    gqa_attention: bool = True

    #: Serve base + a LoRA adapter (``forge_env.weights.adapter``): updates are then adapters alone, checked
    #: against this config (the trainer's ``lora``); the adapter starts at zero (the base model).
    lora: LoRAConfig | None = None

    def __post_init__(self) -> None:
        self.lora = LoRAConfig.coerce(self.lora)


@dataclass
class GeneratorStats:
    """Counters since construction (prefilled + cached == prompt tokens over all requests)."""

    requests: int = 0
    completed: int = 0
    prompt_tokens: int = 0
    prefilled_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    decode_rows: int = 0
    max_decode_batch: int = 0
    #: Last sampled tokens of finished session turns, run through the model so the session caches them.
    flushed_tokens: int = 0
    session_hits: int = 0
    session_misses: int = 0
    #: Prompts that started from the prompt prefix cache (``HFGeneratorConfig.prompt_prefix_cache``).
    prefix_hits: int = 0
    weight_updates: int = 0



class HFGenerator(ContinuousBatching, StickySessions, GeneratorBase):
    """Generator over a transformers causal LM with continuous batching and sticky KV sessions.

    ``weight_source(version)`` (for ``update_weights``) returns a state dict, e.g. ``WeightStore.load``
    from the RL package; ``load_state_dict(state_dict, version)`` loads weights handed over directly.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: HFGeneratorConfig | None = None,
        *,
        weight_source: WeightSource | None = None,
        policy_version: int = 0,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = config or HFGeneratorConfig()
        if self.config.logprobs_mode not in ("processed", "raw"):
            raise ValueError(f"logprobs_mode must be 'processed' or 'raw', got {self.config.logprobs_mode!r}")
        self.weight_source = weight_source
        self._version = policy_version
        self._adapter = None if self.config.lora is None else LoRAServing(self.model, self.config.lora)
        self.device = next(model.parameters()).device
        if self.config.gqa_attention:
            use_gqa_attention(self.model)
        self.max_model_len = self.config.max_model_len or int(model.config.max_position_embeddings)
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.sessions = SessionCacheStore(self.config.max_sessions, self.config.max_session_cache_bytes)
        self._prompt_prefix: SessionKV | None = None
        self._stats = GeneratorStats()
        self._batch = BatchKV()
        self._rows: list[BatchRow] = []
        self._pending: deque[PendingRequest] = deque()
        self._controls: deque[ControlCall] = deque()
        self._busy_sessions: set[str] = set()
        self._released_in_flight: set[str] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._worker, name="hf-generator", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(
        cls,
        path_or_hub_id: str,
        config: HFGeneratorConfig | None = None,
        *,
        device: str | None = None,
        dtype: Any = None,
        seed: int = 0,
        weight_source: WeightSource | None = None,
    ) -> HFGenerator:
        """Load a checkpoint (or ``forge_env.models.TINY_MODEL_ID``) and wrap it."""
        from forge_env.models import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(path_or_hub_id, device=device, dtype=dtype, seed=seed)
        return cls(model, tokenizer, config, weight_source=weight_source)

    # ----------------------------------------------------------------- public API

    async def generate(
        self, prompt_ids: Sequence[int], sampling: SamplingParams | None = None, session_id: str | None = None
    ) -> Completion:
        """Sample one completion; with ``session_id`` the session's KV cache is reused and kept."""
        sampling = self._one_sample(sampling)
        prompt = self._check_prompt(prompt_ids)
        loop = asyncio.get_running_loop()
        request = PendingRequest(prompt, sampling, session_id, loop.create_future(), loop)
        with self._cond:
            if self._closed:
                raise GeneratorClosedError("the generator is closed")
            self._pending.append(request)
            self._stats.requests += 1
            self._cond.notify()
        return await request.future

    async def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Copy ``state_dict`` into the model once running requests finish, drop session caches, set ``version``.

        Requests submitted meanwhile wait and then run on the new weights, so every completion comes
        from exactly one policy version.
        """
        self._check_version(version)
        await self._in_worker(lambda: self._load_weights(state_dict, version), needs_idle=True)

    async def release_session(self, session_id: str) -> None:
        """Drop a session's KV cache (also when it is mid-request: its cache is then not kept)."""
        await self._in_worker(lambda: self._release(session_id), needs_idle=False)

    async def wait_idle(self) -> None:
        """Return once no request is running (finished sessions' caches are then stored)."""
        await self._in_worker(lambda: None, needs_idle=True)

    def stats(self) -> dict[str, Any]:
        """Counters (see ``GeneratorStats``) plus the session store's state."""
        out = asdict(self._stats)
        out.update(
            sessions=len(self.sessions),
            session_cache_bytes=self.sessions.nbytes,
            session_evictions=self.sessions.stats.evictions,
            policy_version=self._version,
        )
        return out

    def close(self) -> None:
        """Stop the worker; pending and running requests fail with ``GeneratorClosedError``."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # ----------------------------------------------------------------- caller side helpers

    def _check_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty; render at least one token (e.g. the generation prompt)")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"prompt_ids contains ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}"
            )
        if len(prompt) >= self.max_model_len:
            raise PromptTooLongError(
                f"prompt has {len(prompt)} tokens but the context window is {self.max_model_len}; "
                "shorten the conversation or raise max_model_len"
            )
        return prompt

    async def _in_worker(self, fn: Callable[[], Any], needs_idle: bool) -> Any:
        loop = asyncio.get_running_loop()
        control = ControlCall(fn, needs_idle, loop.create_future(), loop)
        with self._cond:
            if self._closed:
                raise GeneratorClosedError("the generator is closed")
            self._controls.append(control)
            self._cond.notify()
        return await control.future

    # ----------------------------------------------------------------- weights (run on the worker thread)

    def _load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        if self._adapter is not None:
            self._adapter.load(state_dict, f"the update to version {version}")
            self._updated(version)
            return
        # A weight store's immutable shared-memory views become the parameters as they are (no copy);
        # anything else (e.g. a trainer's live tensors) is copied, so later training cannot leak in.
        adopt = can_adopt_weights(self.model, state_dict)
        result = self.model.load_state_dict(dict(state_dict), strict=False, assign=adopt)
        if adopt:
            retie_embeddings(self.model)
        tied = {k for k in result.missing_keys if k.endswith("lm_head.weight")}
        tied &= {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
        missing = set(result.missing_keys) - tied
        if missing or result.unexpected_keys:
            raise WeightUpdateError(
                f"state dict does not match the model: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(result.unexpected_keys)[:5]}"
            )
        self._updated(version)

    def _updated(self, version: int) -> None:
        if not self.config.keep_sessions_on_update:
            self.sessions.clear()
        self._prompt_prefix = None  # computed with the old weights, whatever keep_sessions_on_update says
        self._version = version
        self._stats.weight_updates += 1


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
