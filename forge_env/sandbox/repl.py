"""The ``python`` tool: a persistent sandboxed interpreter that any tool environment can offer the model.

One :class:`PythonREPL` is one sandbox session (variables, imports and files survive between calls), started
on the first call. Environments create one per episode and close it when the episode ends::

    repl = PythonREPL(sandbox)            # in episode_tools / setup_episode
    tools = [repl.tool]                   # offered to the model as `python(code)`
    ...
    await repl.close()                    # in teardown_episode
"""

from __future__ import annotations

from forge_env.sandbox.base import ExecResult, Sandbox, SandboxSession
from forge_env.sandbox.factory import shared_sandbox
from forge_env.tools import InfraError, Tool, ToolError

DESCRIPTION = ("Run Python code in a persistent sandboxed interpreter (no network; variables, imports and "
               "files persist between calls). Returns what the code prints; the value of a final expression "
               "is shown as in the interactive interpreter.")
#: What runs on a fresh worker to tell a broken sandbox from code that took its worker down.
PROBE = "pass\n"
#: Seconds the tool call may take beyond the sandbox's own deadline (the env's tool timeout must not win).
TOOL_GRACE_S = 10.0


def format_result(result: ExecResult, max_chars: int) -> str:
    """How a cell's result reads to the model: output first, then what went wrong, if anything."""
    parts = [text.rstrip("\n") for text in (result.stdout, result.stderr) if text.strip()]
    if result.killed_reason == "timeout":
        parts.append(f"[execution timed out after {result.duration_s:.1f}s; the interpreter was restarted]")
    elif result.killed_reason == "output_limit":
        parts.append("[output limit reached; the interpreter was restarted]")
    elif result.killed_reason and result.killed_reason != "sandbox_error":
        parts.append(f"[execution stopped: {result.killed_reason}]")
    text = "\n".join(parts) if parts else "(no output)"
    if len(text) > max_chars:
        text = text[: max_chars // 2] + f"\n[... {len(text) - max_chars} characters cut ...]\n" + text[-max_chars // 2:]
    return text


class PythonREPL:
    """A sandboxed REPL exposed as a tool (see the module docstring).

    Args:
        sandbox: where the session runs (default: the process-wide :func:`shared_sandbox`).
        timeout: seconds per call (default: the sandbox's ``wall_timeout_s``).
        max_output_chars: longer output is cut in the middle.
        name: the tool's name.
    """

    def __init__(self, sandbox: Sandbox | None = None, *, timeout: float | None = None,
                 max_output_chars: int = 4000, name: str = "python") -> None:
        self.sandbox = sandbox
        self.timeout = timeout
        self.max_output_chars = max_output_chars
        self._session: SandboxSession | None = None
        #: Cells whose sandbox worker died under them (each graded as the code's failure unless a probe fails).
        self.workers_lost = 0
        self._running = False
        limit = timeout if timeout is not None else (sandbox.limits.wall_timeout_s if sandbox else 10.0)
        self.tool = Tool(
            name=name,
            description=DESCRIPTION,
            parameters={"type": "object",
                        "properties": {"code": {"type": "string", "description": "Python code to run."}},
                        "required": ["code"]},
            fn=self.run,
            timeout=limit + TOOL_GRACE_S,
            timeout_is_infra=True,  # the sandbox stops the code at `limit`; past the grace, the machine stalled
        )

    async def run(self, code: str) -> str:
        """Run ``code`` in the session and return its output as text for the model."""
        if not code.strip():
            raise ToolError("python: the code is empty")
        if self._running:
            # Queued behind another cell, this call's deadline (its own limit plus grace, past which the
            # stall counts as the machine's: InfraError) would run while the other cell runs: parallel
            # calls of slow cells would end the episode as an infra failure. One call at a time.
            raise ToolError("python: the interpreter is still running another call; call it one at a time")
        self._running = True
        try:
            if self._session is None:
                self.sandbox = self.sandbox or shared_sandbox()
                self._session = self.sandbox.session()
            result = await self._session.run(code, timeout=self.timeout)
            if result.killed_reason == "sandbox_error":
                return await self._worker_lost(result)
            return format_result(result, self.max_output_chars)
        finally:
            self._running = False

    async def _worker_lost(self, result: ExecResult) -> str:
        """A cell whose worker died: the machine's doing only if a fresh run of ``pass`` fails too.

        Counting every lost worker as the machine's (``InfraError``: the episode is dropped from training)
        would let the model's code cancel its own episode by taking its worker down. The cell is not run
        again (it may have had side effects); a probe on a fresh worker decides whose failure it was.
        """
        self.workers_lost += 1
        assert self.sandbox is not None
        probe = await self.sandbox.run(PROBE, timeout=self.timeout)
        if not probe.ok:
            raise InfraError(f"python: the sandbox failed ({result.stderr.strip()[:300]}) and fails a program "
                             f"that does nothing too ({probe.killed_reason or probe.exit_code})")
        return ("[execution stopped: the interpreter's sandbox worker was lost while running this code; "
                "the interpreter was restarted and earlier state is gone]")

    async def close(self) -> None:
        """End the session and everything it started; the next call would start a fresh one."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
