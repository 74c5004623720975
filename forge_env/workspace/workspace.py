"""The per-episode workspace: a repository checkout (or a task's container) in a sandbox session of its own.

A workspace is one :meth:`Sandbox.session` (a worker of its own, on either backend): the first call
unpacks the episode's :class:`Checkout` (a tree and a fresh ``.git``, e.g. SWE-v0's cached base checkout)
into the session's private scratch directory, a tmpfs owned by the sandbox's unprivileged uid, with no
network. Files persist between calls because the session's directory does; the session's tmpfs size
(``workdir_size_mb``) bounds the disk, ``max_processes`` the processes. Each tool call runs a helper that
the first cell defined (:data:`~forge_env.workspace.cell.CELL`: ``bash``, ``view``, ``edit``, ``create``,
``snapshot``); ``bash`` enforces its own deadline inside the cell (the command's process group is killed,
the workspace survives). When the session's worker is lost anyway (the agent killed it), the workspace is
set up again from the checkout and the model is told (``reset_note``). Spare sessions started ahead of need
(``spares.py``) take the worker's start off the set-up. Closing the session kills every process the agent
left and frees the tmpfs; a worker whose host process dies takes its tmpfs with it.

:meth:`Workspace.snapshot` is what grading reads: the files that differ from the checkout, untrusted; grade
them in a fresh sandbox run (:func:`~forge_env.workspace.graded_runs.graded_run`), never in the agent's session.
Subclass it for another kind of workspace (Terminal-v0: a task's container, ``bash`` only, committed at the end).
"""

from __future__ import annotations

import base64
import json
from typing import Any, Protocol

from forge_env.errors import InfraError
from forge_env.sandbox import ExecResult, Sandbox, SandboxSession
from forge_env.sandbox.base import SandboxError
from forge_env.workspace.cell import CELL
from forge_env.workspace.spares import take_session

#: Seconds a sandbox call may take beyond a helper's own deadline.
GRACE_S = 15.0
RESET_NOTE = ("[the sandbox lost this workspace (its processes were killed); it was set up again from the "
              "base commit: earlier changes are gone]")


class WorkspaceError(Exception):
    """A tool call the model can correct (the message is shown to it)."""


class Checkout(Protocol):
    """What a workspace starts from (SWE-v0's ``BaseCheckout`` is one)."""

    @property
    def workspace_tar(self) -> bytes:
        """A tar.gz of ``repo/`` (the tree and its ``.git``), unpacked into the session's directory."""

    @property
    def manifest(self) -> dict[str, str]:
        """sha256 of every file of the tree (``link:<target>`` for symlinks): what a snapshot compares with."""


class Workspace:
    """One episode's checkout inside a sandbox session (see the module docstring).

    Args:
        sandbox: where the session runs. checkout: what it starts from (None: a subclass starts it).
        output_cap: characters of a tool's output kept; snapshot_cap: bytes a snapshot carries.
        spares: sessions of ``sandbox`` kept started ahead of need (``spares.py``; 0: none).
        env: ``PYTEST_*`` variables for the agent's shell.
        reset_note: what the model is told when its session was lost and the workspace set up again.
    """

    def __init__(self, sandbox: Sandbox, checkout: Checkout | None, *, output_cap: int = 8000,
                 snapshot_cap: int = 4 << 20, spares: int = 0, env: dict[str, str] | None = None,
                 reset_note: str = RESET_NOTE) -> None:
        self.sandbox = sandbox
        self.spares = spares
        self.env = dict(env or {})  # PYTEST_* variables for the agent's shell (grading's plugin choice)
        self.checkout = checkout
        self.output_cap = output_cap
        self.snapshot_cap = snapshot_cap
        self.reset_note = reset_note
        self.root: str | None = None
        self.resets = 0
        self.session: SandboxSession | None = None

    @property
    def _session(self) -> SandboxSession | None:  # the old name (tests read it)
        return self.session

    async def start(self) -> str:
        """Open the session and unpack the checkout; InfraError when the sandbox cannot do it."""
        if self.checkout is None:
            raise InfraError("workspace: no checkout to start from")
        try:
            self.session = await take_session(self.sandbox, self.spares)
            code = "_setup()\n"
            if self.session is None:
                self.session, code = self.sandbox.session(), CELL + "\n_setup()\n"
            result = await self.session.run(code, files={"_base.tar.gz": self.checkout.workspace_tar},
                                            stdin=json.dumps({"env": self.env}), timeout=120)
        except (SandboxError, OSError) as exc:
            raise InfraError(f"SWE workspace: the sandbox could not start a session ({exc})") from exc
        reply = parse_reply(result)
        if reply is None or "ok" not in reply:
            raise InfraError(f"SWE workspace: setting up the checkout failed ({result.summary(600)})")
        self.root = reply["ok"]
        return self.root

    async def call(self, helper: str, deadline: float, **arguments: Any) -> Any:
        """Run one helper; WorkspaceError for what the model can correct."""
        if self.session is None:
            raise InfraError("SWE workspace: used before start() or after close()")
        result = await self.session.run(f"_{helper}()\n", stdin=json.dumps(arguments),
                                        timeout=deadline + GRACE_S)
        reply = parse_reply(result)
        if reply is None or result.killed_reason is not None or "[sandbox] the session" in result.stderr:
            await self.reset()
            if reply is not None and "ok" in reply and helper == "bash":
                return reply["ok"] | {"note": self.reset_note}
            raise WorkspaceError(f"{helper}: the call did not finish ({result.killed_reason or 'no reply'}). "
                                 + self.reset_note)
        if "error" in reply:
            raise WorkspaceError(reply["error"])
        return reply["ok"]

    async def reset(self) -> None:
        """The session lost its state (or never answered): start over from the checkout."""
        self.resets += 1
        await self.close()
        await self.start()

    async def bash(self, command: str, timeout: float) -> str:
        out = await self.call("bash", timeout, command=command, timeout=timeout, cap=self.output_cap // 2)
        text = out["output"].rstrip("\n")
        if out["timed_out"]:
            text += f"\n[command timed out after {timeout:g}s and was killed; the workspace is intact]"
        elif out["exit_code"]:
            text += f"\n[exit code {out['exit_code']}]"
        if out.get("note"):
            text += "\n" + out["note"]
        return text or "(no output)"

    async def view(self, path: str, start_line: int | None = None, end_line: int | None = None) -> str:
        return await self.call("view", 30, path=path, start_line=start_line, end_line=end_line, cap=self.output_cap)

    async def edit(self, path: str, old_str: str, new_str: str) -> str:
        return await self.call("edit", 30, path=path, old_str=old_str, new_str=new_str)

    async def create(self, path: str, content: str) -> str:
        return await self.call("create", 30, path=path, content=content)

    async def snapshot(self) -> Snapshot:
        """What the agent changed, by content against the base manifest (untrusted: grading filters it).
        A workspace that cannot be read gives an empty snapshot with ``lost=True`` (graded as no change)."""
        if self.checkout is None:
            raise InfraError("workspace: no checkout to compare a snapshot with")
        try:
            out = await self.call("snapshot", 60, manifest=self.checkout.manifest, cap=self.snapshot_cap)
        except WorkspaceError as exc:
            return Snapshot({}, [], [], [], lost=str(exc))
        return snapshot_of(out)

    async def close(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            try:
                await session.close()
            except SandboxError:
                pass


class Snapshot:
    """The workspace's files that differ from its checkout: contents, deletions, and what was left out."""

    def __init__(self, changed: dict[str, bytes], deleted: list[str], odd: list[str], too_big: list[str],
                 lost: str | None = None) -> None:
        self.changed = changed
        self.deleted = deleted
        self.odd = odd  # symlinks, fifos and the like: never carried to grading
        self.too_big = too_big  # past the snapshot cap: never carried
        self.lost = lost


def snapshot_of(out: Any) -> Snapshot:
    """The snapshot helper's reply, checked. The agent's processes share the session's uid: they can write
    on the session interpreter's pipes (``/proc/<pid>/fd``) and put a reply of any shape (another call's,
    say) where this one's belongs. A reply of the wrong shape is a lost workspace (graded as no change),
    never an exception: one here would end the episode as an error, unscored, by the agent's doing."""
    def paths(value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise TypeError("not a list of paths")
        return value

    try:
        changed = out["changed"]
        if not isinstance(changed, dict) or not all(isinstance(p, str) and isinstance(d, str)
                                                    for p, d in changed.items()):
            raise TypeError("not a mapping of paths to contents")
        return Snapshot({path: base64.b64decode(data, validate=True) for path, data in changed.items()},
                        paths(out["deleted"]), paths(out["odd"]), paths(out["too_big"]))
    except (KeyError, TypeError, ValueError) as exc:  # (binascii.Error is a ValueError)
        return Snapshot({}, [], [], [], lost=f"snapshot: the workspace's reply was malformed ({exc!r:.200})")


def parse_reply(result: ExecResult) -> dict[str, Any] | None:
    """A cell helper's JSON reply: the last line of stdout (None when it is not a JSON object)."""
    lines = result.stdout.rstrip("\n").rsplit("\n", 1)
    try:
        value = json.loads(lines[-1])
    except (json.JSONDecodeError, IndexError):
        return None
    return value if isinstance(value, dict) else None
