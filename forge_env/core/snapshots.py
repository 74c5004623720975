"""Episode snapshots: a running episode's state after a completed turn, as JSON, restorable in a fresh env.

What makes an episode durable (docs/services.md "Durable sessions"): after each completed turn a session
client keeps the environment's :meth:`~Snapshots.snapshot`; when the process holding the episode dies, a
fresh instance of the same environment (on another replica) is :meth:`~Snapshots.arestore`'d from it and the
episode goes on from that turn, as if nothing happened (:meth:`TextEnv.arestore
<forge_env.core.env.TextEnv.arestore>`).

The default covers what :class:`~forge_env.core.env.TextEnv` itself keeps of an episode: the
:class:`~forge_env.types.EpisodeState` (task, messages, counters, metrics, ``data``, an end request, a
plain :class:`~forge_env.types.Verdict`) and the env's seeded RNG. The episode's tools are rebuilt by
``episode_tools(state)``. That is all an environment holds when its per-episode state lives in
``state`` as plain data, and such an environment says so with ``supports_snapshots = True`` (Arithmetic-v0,
Math-v0, ToolUse-v0 without its python REPL, Coding-v0 without tools). An environment that holds more (an
open sandbox session, a workspace, state on ``self``) leaves it ``False``: its episodes are lost with their
process, as before. One whose ``state.data`` holds objects turns them into plain data and back with
:meth:`~Snapshots.snapshot_data` / :meth:`~Snapshots.restore_data`.

A snapshot taken with ``messages_from=n`` holds only the messages after the first ``n`` (and no task): a
*delta* that :func:`merge_snapshot` applies to the snapshot a client already holds, so shipping a snapshot
after each turn costs the turn's new messages, not the whole conversation again.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from forge_env.core.episode import EnvError
from forge_env.types import EpisodeState, Verdict

SNAPSHOT_VERSION = 1

# EpisodeState fields a snapshot keeps as they are (plain data); messages, task, data and verdict are handled apart.
_PLAIN_FIELDS = ("turn", "tool_calls", "tool_errors", "format_errors", "chars", "total_reward", "done", "metrics",
                 "end_request")

__all__ = ["SNAPSHOT_VERSION", "SnapshotError", "Snapshots", "merge_snapshot"]


class SnapshotError(EnvError):
    """An episode cannot be snapshotted (the env does not support it, its state is not plain data) or a
    snapshot cannot be restored (another environment's, another version, no episode in it)."""


def _plain(value: Any, what: str) -> Any:
    """A deep copy of ``value`` through JSON: plain data only (dict, list, str, number, bool, None)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as error:
        raise SnapshotError(f"{what} is not JSON-serialisable ({error}); keep plain data in state.data, or "
                            "override snapshot_data/restore_data") from None


def merge_snapshot(held: dict[str, Any] | None, delta: dict[str, Any]) -> dict[str, Any]:
    """The full snapshot after applying ``delta`` (taken with ``messages_from=n``) to ``held``, the full
    snapshot of an earlier turn of the same episode (``None`` only when ``delta`` is itself full).

    ``held``'s message list is reused (its messages after the first ``n`` replaced by the delta's), so a client
    merging after every turn copies each message once, not the conversation every turn: ``held`` is consumed.
    """
    start = delta.get("messages_from", 0)
    if start == 0:
        return delta
    if held is None or len(held["state"]["messages"]) < start:
        raise SnapshotError(f"a snapshot delta from message {start} needs the snapshot it extends")
    messages = held["state"]["messages"]
    del messages[start:]
    messages.extend(delta["state"]["messages"])
    state = {**delta["state"], "task": held["state"]["task"], "messages": messages}
    return {**delta, "state": state, "messages_from": 0}


class Snapshots:
    """The snapshot protocol of :class:`~forge_env.core.env.TextEnv` (mixed into it; see the module docstring)."""

    #: Whether :meth:`snapshot` captures everything an episode of this environment holds. An instance may
    #: set it too (ToolUse-v0 with its python REPL cannot).
    supports_snapshots: bool = False

    state: EpisodeState | None
    np_random: np.random.Generator

    def snapshot_data(self, state: EpisodeState) -> dict[str, Any]:
        """``state.data`` as plain data for a snapshot. Override when it holds objects (and :meth:`restore_data`)."""
        return state.data

    def restore_data(self, data: dict[str, Any]) -> dict[str, Any]:
        """``state.data`` back from what :meth:`snapshot_data` gave. Default: as it is."""
        return data

    def snapshot(self, *, messages_from: int = 0) -> dict[str, Any]:
        """The running episode after its last completed turn, as a JSON-serialisable dict (a deep copy).

        ``messages_from=n``: only the messages after the first ``n``, and no task (a delta for
        :func:`merge_snapshot`). :class:`SnapshotError` when the env does not support snapshots, has no
        episode, or holds state that is not plain data.
        """
        if not self.supports_snapshots:
            raise SnapshotError(f"{type(self).__name__} does not support snapshots (supports_snapshots=False)")
        state = self.state
        if state is None:
            raise SnapshotError("no episode to snapshot: call reset() first")
        if not 0 <= messages_from <= len(state.messages):
            raise SnapshotError(f"messages_from={messages_from} is outside the episode's {len(state.messages)} messages")
        if state.verdict is not None and type(state.verdict) is not Verdict:
            raise SnapshotError(f"the episode's verdict is a {type(state.verdict).__name__}, which a snapshot "
                                "cannot restore")
        fields: dict[str, Any] = {name: getattr(state, name) for name in _PLAIN_FIELDS}
        fields["messages"] = state.messages[messages_from:]
        fields["data"] = self.snapshot_data(state)
        fields["verdict"] = None if state.verdict is None else dataclasses.asdict(state.verdict)
        if messages_from == 0:
            fields["task"] = state.task
        value = {"version": SNAPSHOT_VERSION, "env": type(self).__qualname__, "messages_from": messages_from,
                 "state": fields, "rng": self.np_random.bit_generator.state}
        return _plain(value, f"{type(self).__name__}'s episode state")

    def restored_state(self, snapshot: dict[str, Any]) -> EpisodeState:
        """The episode state in ``snapshot`` (a full one, from :meth:`snapshot` or :func:`merge_snapshot`),
        with this env's RNG set as it was; :meth:`TextEnv.arestore <forge_env.core.env.TextEnv.arestore>`
        makes it the running episode. :class:`SnapshotError` if ``snapshot`` is not one of this env's."""
        if not self.supports_snapshots:
            raise SnapshotError(f"{type(self).__name__} does not support snapshots (supports_snapshots=False)")
        if not isinstance(snapshot, dict) or snapshot.get("version") != SNAPSHOT_VERSION:
            raise SnapshotError(f"not a version-{SNAPSHOT_VERSION} episode snapshot")
        if snapshot.get("env") != type(self).__qualname__:
            raise SnapshotError(f"a snapshot of {snapshot.get('env')} cannot be restored into {type(self).__name__}")
        if snapshot.get("messages_from", 0) != 0:
            raise SnapshotError("a snapshot delta cannot be restored on its own: merge_snapshot it first")
        fields = _plain(snapshot["state"], "the snapshot")
        verdict = fields.pop("verdict")
        state = EpisodeState(task=fields.pop("task"), messages=fields.pop("messages"),
                             data=self.restore_data(fields.pop("data")),
                             verdict=None if verdict is None else Verdict(**verdict),
                             **{name: fields[name] for name in _PLAIN_FIELDS})
        rng = snapshot["rng"]
        generator = np.random.Generator(getattr(np.random, rng["bit_generator"])())
        generator.bit_generator.state = rng
        self.np_random = generator
        return state
