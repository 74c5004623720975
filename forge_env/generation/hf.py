"""``HFGenerator``: a transformers causal LM behind the ``Generator`` protocol, CPU or GPU.

One worker thread owns the model and runs a continuous-batching loop: requests that arrive while others
are decoding are prefilled and join the running batch at the next step, and every decode step is one
forward pass over all running rows (left-padded KV cache, pad columns masked). Sticky sessions keep each
session's KV cache between turns; a prompt that extends the cached tokens only prefills the new suffix
(a prompt that diverges reuses the common prefix). Idle session caches are LRU-bounded by count and bytes
and are dropped on a weight update unless ``keep_sessions_on_update``.

Callers await asyncio futures from any event loop; the model never runs on the caller's loop.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from forge_env.generation.base import (
    Completion,
    GenerationError,
    GeneratorBase,
    GeneratorClosedError,
    PromptTooLongError,
    SamplingParams,
    WeightSource,
    WeightUpdateError,
)
from forge_env.generation.kv_cache import BatchKV, LayerKV, SessionCacheStore, SessionKV, cache_from_layers
from forge_env.generation.sampling import LogprobsMode, sample_tokens
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
    weight_updates: int = 0


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    session_id: str | None
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class _Row:
    request: _Request
    rng: torch.Generator | None
    stop_ids: frozenset[int]
    length: int  # tokens whose KV is in the batch cache
    num_cached: int
    policy_version: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False
    flushing: bool = False  # finished; one more step writes its last token's KV for the session


@dataclass
class _Control:
    fn: Callable[[], Any]
    needs_idle: bool
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class HFGenerator(GeneratorBase):
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
        self.device = next(model.parameters()).device
        self.max_model_len = self.config.max_model_len or int(model.config.max_position_embeddings)
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.sessions = SessionCacheStore(self.config.max_sessions, self.config.max_session_cache_bytes)
        self._stats = GeneratorStats()
        self._batch = BatchKV()
        self._rows: list[_Row] = []
        self._pending: deque[_Request] = deque()
        self._controls: deque[_Control] = deque()
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
        request = _Request(prompt, sampling, session_id, loop.create_future(), loop)
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
        control = _Control(fn, needs_idle, loop.create_future(), loop)
        with self._cond:
            if self._closed:
                raise GeneratorClosedError("the generator is closed")
            self._controls.append(control)
            self._cond.notify()
        return await control.future

    # ----------------------------------------------------------------- worker thread

    def _worker(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not (self._closed or self._pending or self._controls or self._rows):
                        self._cond.wait()
                    if self._closed:
                        break
                    controls = self._runnable_controls()
                    admitted = [] if self._idle_control_waiting() else self._admit()
                for control in controls:
                    self._run_control(control)
                try:
                    if admitted:
                        self._prefill_and_join(admitted)
                    if self._rows:
                        self._decode_step()
                except Exception as exc:  # a failed forward fails its requests, not the worker
                    self._fail_running(GenerationError(f"generation failed: {exc!r}"), exc)
        self._shutdown()

    def _idle_control_waiting(self) -> bool:
        return any(c.needs_idle for c in self._controls)

    def _runnable_controls(self) -> list[_Control]:
        runnable = [c for c in self._controls if not c.needs_idle or not self._rows]
        for control in runnable:
            self._controls.remove(control)
        return runnable

    def _run_control(self, control: _Control) -> None:
        try:
            result = control.fn()
        except Exception as exc:
            _resolve(control.loop, control.future, error=exc)
        else:
            _resolve(control.loop, control.future, result=result)

    def _admit(self) -> list[_Request]:
        admitted: list[_Request] = []
        room = self.config.max_batch_size - len(self._rows)
        keep: deque[_Request] = deque()
        while self._pending:
            request = self._pending.popleft()
            if request.future.cancelled():
                continue
            if room <= 0 or (request.session_id is not None and request.session_id in self._busy_sessions):
                keep.append(request)  # a session's turns run one at a time, in order
                continue
            if request.session_id is not None:
                self._busy_sessions.add(request.session_id)
            admitted.append(request)
            room -= 1
        self._pending = keep
        return admitted

    def _prefill_and_join(self, requests: list[_Request]) -> None:
        rows, caches, last_logits = [], [], []
        for request in requests:
            entry = self.sessions.take(request.session_id) if request.session_id is not None else None
            cached = entry.reusable_prefix(request.prompt_ids) if entry is not None else 0
            if request.session_id is not None:
                stat = "session_hits" if cached else "session_misses"
                setattr(self._stats, stat, getattr(self._stats, stat) + 1)
            past = entry.cropped(cached).layers if cached else None
            logits, layers = self._prefill(request.prompt_ids[cached:], past, start=cached)
            self._stats.prompt_tokens += len(request.prompt_ids)
            self._stats.prefilled_tokens += len(request.prompt_ids) - cached
            self._stats.cached_tokens += cached
            rows.append(self._new_row(request, cached))
            caches.append(layers)
            last_logits.append(logits)
        self._sample_into(rows, torch.stack(last_logits))
        joining = [
            (row, kv) for row, kv in zip(rows, caches, strict=True) if row.flushing or not row.finished
        ]
        self._batch.join([kv for _, kv in joining])
        self._rows.extend(row for row, _ in joining)

    def _prefill(
        self, token_ids: list[int], past: list[LayerKV] | None, start: int
    ) -> tuple[torch.Tensor, list[LayerKV]]:
        cache = cache_from_layers(past, num_layers=self.model.config.num_hidden_layers)
        chunk = self.config.prefill_chunk_size
        logits = None
        for offset in range(0, len(token_ids), chunk):
            piece = torch.tensor([token_ids[offset : offset + chunk]], device=self.device)
            positions = torch.arange(start + offset, start + offset + piece.shape[1], device=self.device)[
                None
            ]
            out = self.model(
                input_ids=piece,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[0, -1]
        return logits, [(layer.keys, layer.values) for layer in cache.layers]

    def _new_row(self, request: _Request, cached: int) -> _Row:
        sampling = request.sampling
        rng = None
        if not sampling.greedy:
            rng = torch.Generator(device=self.device)
            rng.manual_seed(sampling.seed if sampling.seed is not None else random.getrandbits(63))
        stop_ids = frozenset(sampling.stop_token_ids) | (
            frozenset() if sampling.ignore_eos else self.eos_token_ids
        )
        return _Row(request, rng, stop_ids, len(request.prompt_ids), cached, self._version)

    def _decode_step(self) -> None:
        rows = self._rows
        input_ids = torch.tensor([[row.tokens[-1]] for row in rows], device=self.device)
        positions = torch.tensor([[row.length] for row in rows], device=self.device)
        out = self.model(
            input_ids=input_ids,
            attention_mask=self._batch.attention_mask(),
            position_ids=positions,
            past_key_values=self._batch.cache,
            use_cache=True,
        )
        self._stats.decode_steps += 1
        self._stats.decode_rows += len(rows)
        self._stats.max_decode_batch = max(self._stats.max_decode_batch, len(rows))
        for row in rows:
            row.length += 1
        keep: list[int] = []
        for index, row in enumerate(rows):
            if row.flushing:
                self._stats.flushed_tokens += 1
                self._store_session(row, self._batch.extract(index))
            else:
                keep.append(index)
        sampling_rows = [rows[i] for i in keep]
        if sampling_rows:
            self._sample_into(sampling_rows, out.logits[keep, -1])
        survivors = [i for i in keep if rows[i].flushing or not rows[i].finished]
        self._batch.select(survivors)
        self._rows = [rows[i] for i in survivors]

    def _sample_into(self, rows: list[_Row], logits: torch.Tensor) -> None:
        """Sample one token for each row; finish the rows that are done (sessions first flush their last token)."""
        tokens, logprobs = sample_tokens(
            logits, [r.request.sampling for r in rows], [r.rng for r in rows], self.config.logprobs_mode
        )
        for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            self._stats.generated_tokens += 1
            reason = "abort" if row.request.future.cancelled() else self._finish_reason(row)
            if reason:
                self._finish(row, reason)

    def _finish_reason(self, row: _Row) -> str | None:
        token = row.tokens[-1]
        if token in row.stop_ids:
            return "stop"
        if row.request.sampling.stop and self._stop_string(row) is not None:
            return "stop"
        if len(row.tokens) >= row.request.sampling.max_tokens or row.length + 1 >= self.max_model_len:
            return "length"
        return None

    def _stop_string(self, row: _Row) -> str | None:
        stops = row.request.sampling.stop
        tail = self.tokenizer.decode(row.tokens[-(max(map(len, stops)) + 4) :], skip_special_tokens=False)
        return next((s for s in stops if s in tail), None)

    def _finish(self, row: _Row, reason: str) -> None:
        row.finished = True
        request = row.request
        sampling = request.sampling
        stop_reason: int | str | None = None
        text_ids = row.tokens
        if reason == "stop" and row.tokens[-1] in row.stop_ids:
            stop_reason = row.tokens[-1]
            text_ids = row.tokens[:-1]
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
        if reason == "stop" and stop_reason is None:
            stop_reason = self._stop_string(row)
            cut = text.find(stop_reason)
            if cut >= 0:
                text = text[: cut + (len(stop_reason) if sampling.include_stop_str_in_output else 0)]
        completion = Completion(
            prompt_ids=request.prompt_ids,
            token_ids=list(row.tokens),
            logprobs=list(row.logprobs),
            text=text,
            finish_reason=reason,  # type: ignore[arg-type]
            policy_version=row.policy_version,
            num_cached_tokens=row.num_cached,
            stop_reason=stop_reason,
        )
        self._stats.completed += 1
        _resolve(request.loop, request.future, result=completion)
        if request.session_id is not None:
            if request.session_id in self._released_in_flight or reason == "abort":
                self._end_session_use(request.session_id)
            else:
                row.flushing = True

    def _store_session(self, row: _Row, layers: list[LayerKV]) -> None:
        session_id = row.request.session_id
        if session_id not in self._released_in_flight:
            self.sessions.put(session_id, SessionKV(row.request.prompt_ids + row.tokens, layers))
        self._end_session_use(session_id)

    def _end_session_use(self, session_id: str) -> None:
        self._busy_sessions.discard(session_id)
        self._released_in_flight.discard(session_id)

    def _release(self, session_id: str) -> bool:
        if session_id in self._busy_sessions:
            self._released_in_flight.add(session_id)
        return self.sessions.release(session_id)

    def _load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
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
        if not self.config.keep_sessions_on_update:
            self.sessions.clear()
        self._version = version
        self._stats.weight_updates += 1

    def _fail_running(self, error: Exception, cause: Exception) -> None:
        error.__cause__ = cause
        for row in self._rows:
            if row.request.session_id is not None:
                self._end_session_use(row.request.session_id)
            _resolve(row.request.loop, row.request.future, error=error)
        self._rows = []
        self._batch = BatchKV()

    def _shutdown(self) -> None:
        closed = GeneratorClosedError("the generator was closed")
        with self._cond:
            pending, self._pending = list(self._pending), deque()
            controls, self._controls = list(self._controls), deque()
        for request in pending:
            _resolve(request.loop, request.future, error=closed)
        for control in controls:
            _resolve(control.loop, control.future, error=closed)
        for row in self._rows:
            _resolve(row.request.loop, row.request.future, error=closed)
        self._rows = []
        self._batch = BatchKV()
        self.sessions.clear()


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


def _resolve(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future,
    *,
    result: Any = None,
    error: Exception | None = None,
) -> None:
    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the caller's loop is gone; nobody is waiting
        pass

