"""Sticky KV sessions of :class:`~forge_env.generation.hf.HFGenerator`.

A request with a ``session_id`` takes its session's cached KV out of the LRU store
(:class:`~forge_env.generation.kv_cache.SessionCacheStore`) and prefills only the suffix past the longest
common prefix. While a turn runs the session is busy (its next turn waits in the queue); when it finishes,
its row stays one more decode step so the last sampled token's KV is written, and the whole sequence goes
back into the store. A session released mid-turn is not stored again; an aborted turn is not stored.

A mixin run on the worker thread; ``HFGenerator`` holds the store and the busy/released sets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from forge_env.generation.kv_cache import LayerKV, SessionKV

if TYPE_CHECKING:
    from forge_env.generation.hf_batching import BatchRow, PendingRequest


class StickySessions:
    """Bookkeeping of the sessions in use: reusing a cache, storing a finished turn's KV, releasing."""

    def _reuse_session(self, request: PendingRequest) -> tuple[int, list[LayerKV] | None, bool]:
        """How many prompt tokens the request's session has cached, their KV (taken out of the store), and
        whether they came from the session; without a session cache, the prompt prefix cache's share
        (``HFGeneratorConfig.prompt_prefix_cache``)."""
        entry = self.sessions.take(request.session_id) if request.session_id is not None else None
        cached = entry.reusable_prefix(request.prompt_ids) if entry is not None else 0
        if request.session_id is not None:
            stat = "session_hits" if cached else "session_misses"
            setattr(self._stats, stat, getattr(self._stats, stat) + 1)
        if not cached and self._prompt_prefix is not None:
            shared = self._prompt_prefix.reusable_prefix(request.prompt_ids)
            if shared >= self.config.min_prompt_prefix:
                self._stats.prefix_hits += 1
                return shared, self._prompt_prefix.cropped(shared).layers, False
        past = entry.cropped(cached).layers if cached else None
        return cached, past, bool(cached)

    def _keep_prompt_prefix(self, request: PendingRequest, layers: list[LayerKV]) -> None:
        """After a prefill that no session cache covered: keep its prompt's KV (a copy: the batch goes on
        writing its own) for the next such prompts to share."""
        if self.config.prompt_prefix_cache:
            self._prompt_prefix = SessionKV(list(request.prompt_ids), [(k.clone(), v.clone()) for k, v in layers])

    def _turn_done(self, row: BatchRow, reason: str) -> None:
        """A session's turn finished: keep its row one step to flush the last token, unless released or aborted."""
        session_id = row.request.session_id
        if session_id in self._released_in_flight or reason == "abort":
            self._end_session_use(session_id)
        else:
            row.flushing = True

    def _store_session(self, row: BatchRow, layers: list[LayerKV]) -> None:
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
