"""The continuous-batching scheduler of :class:`~forge_env.generation.hf.HFGenerator` (its worker thread).

One worker thread owns the model. Each pass it runs the control calls that may run now (a weight load
waits until no row is running), admits pending requests up to ``max_batch_size`` (a session's turns one
at a time, in order), prefills them (chunked; a sticky session only its new suffix) and joins them to the
running batch, then runs one decode step: a single forward pass over all running rows of the left-padded
batch KV cache. A finished row leaves the batch; a finished session turn first stays one step to write its
last token's KV for the session (:mod:`forge_env.generation.hf_sessions`).

A mixin: ``HFGenerator`` holds the state (model, config, queues, batch cache, stats) and the caller side.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from forge_env.generation.base import Completion, GenerationError, GeneratorClosedError, SamplingParams
from forge_env.generation.kv_cache import BatchKV, LayerKV, cache_from_layers
from forge_env.generation.sampling import sample_tokens


@dataclass
class PendingRequest:
    """A generate call waiting for a batch row (its future is resolved on the caller's loop)."""

    prompt_ids: list[int]
    sampling: SamplingParams
    session_id: str | None
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


@dataclass
class BatchRow:
    """One request decoding in the running batch."""

    request: PendingRequest
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
class ControlCall:
    """A call run on the engine thread between steps (``needs_idle``: only once no row is decoding)."""

    fn: Callable[[], Any]
    needs_idle: bool
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class ContinuousBatching:
    """The worker-thread half of ``HFGenerator``: admission, prefill, batched decode, finishing rows."""

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

    def _runnable_controls(self) -> list[ControlCall]:
        runnable = [c for c in self._controls if not c.needs_idle or not self._rows]
        for control in runnable:
            self._controls.remove(control)
        return runnable

    def _run_control(self, control: ControlCall) -> None:
        try:
            result = control.fn()
        except Exception as exc:
            _resolve(control.loop, control.future, error=exc)
        else:
            _resolve(control.loop, control.future, result=result)

    def _admit(self) -> list[PendingRequest]:
        admitted: list[PendingRequest] = []
        room = self.config.max_batch_size - len(self._rows)
        keep: deque[PendingRequest] = deque()
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

    def _prefill_and_join(self, requests: list[PendingRequest]) -> None:
        rows, caches, last_logits = [], [], []
        for request in requests:
            cached, past, from_session = self._reuse_session(request)
            logits, layers = self._prefill(request.prompt_ids[cached:], past, start=cached)
            if not from_session:
                self._keep_prompt_prefix(request, layers)
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

    def _new_row(self, request: PendingRequest, cached: int) -> BatchRow:
        sampling = request.sampling
        rng = None
        if not sampling.greedy:
            rng = torch.Generator(device=self.device)
            rng.manual_seed(sampling.seed if sampling.seed is not None else random.getrandbits(63))
        stop_ids = frozenset(sampling.stop_token_ids) | (
            frozenset() if sampling.ignore_eos else self.eos_token_ids
        )
        return BatchRow(request, rng, stop_ids, len(request.prompt_ids), cached, self._version)

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

    def _sample_into(self, rows: list[BatchRow], logits: torch.Tensor) -> None:
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

    def _finish_reason(self, row: BatchRow) -> str | None:
        token = row.tokens[-1]
        if token in row.stop_ids:
            return "stop"
        if row.request.sampling.stop and self._stop_string(row) is not None:
            return "stop"
        if len(row.tokens) >= row.request.sampling.max_tokens or row.length + 1 >= self.max_model_len:
            return "length"
        return None

    def _stop_string(self, row: BatchRow) -> str | None:
        stops = row.request.sampling.stop
        tail = self.tokenizer.decode(row.tokens[-(max(map(len, stops)) + 4) :], skip_special_tokens=False)
        return next((s for s in stops if s in tail), None)

    def _finish(self, row: BatchRow, reason: str) -> None:
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
            self._turn_done(row, reason)

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
        self._prompt_prefix = None


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

