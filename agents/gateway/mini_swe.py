"""A mini-swe-agent execution environment that runs the agent's commands in a forge-env episode (SWE-v0).

mini-swe-agent loads its environment class from its config (``environment.environment_class`` takes an
import path), so the package stays unmodified::

    environment:
      environment_class: agents.gateway.mini_swe.GatewayEnvironment
      base_url: http://127.0.0.1:8100/e/<episode>/v1    # the episode's base URL, as for the model
      api_key: <the gateway's harness token>

Each ``execute`` posts the command to the gateway (``POST /e/<episode>/env/tools/bash``), where the trainer has
attached the episode's environment (``gateway.envs.attach``): for SWE-v0 that is the ``bash`` tool's own path,
the episode's workspace in its sandbox session, with SWE-v0's limits. Grading is the trainer's
(``gateway.envs.finish``): the harness holds no reward and cannot grade itself. The first output line
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` of a command that exits 0 ends the run as mini-swe-agent's own
environments do; the environment's episode ending (its turn limit) ends the run as a limit does.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
from typing import Any

import httpx
from pydantic import BaseModel

#: SWE-v0's bash tool ends an output with these (``forge_env.workspace.Workspace.bash``).
_EXIT_CODE = re.compile(r"\n?\[exit code (-?\d+)\]$")
_TIMED_OUT = re.compile(r"\n?\[command timed out after [^\]]*\]$")
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class GatewayEnvironmentConfig(BaseModel):
    base_url: str
    """The episode's base URL on the gateway (``.../e/<episode>/v1``, as given to the model, or ``.../e/<episode>``)."""
    api_key: str = ""
    """The gateway's harness token (default ``$OPENAI_API_KEY``)."""
    tool: str = "bash"
    """The environment's tool that runs a shell command (argument ``command``)."""
    cwd: str = ""
    """A directory (relative to the workspace) each command starts in; default: the workspace's own."""
    env: dict[str, str] = {}
    """Variables exported before each command (mini-swe-agent's configs set PAGER and the like)."""
    timeout: int = 600
    """Seconds to wait for the gateway's answer (the environment's own limit of a command is shorter)."""


class GatewayEnvironment:
    """mini-swe-agent's ``Environment`` protocol over a forge-env episode behind the gateway (module docstring)."""

    def __init__(self, *, config_class: type = GatewayEnvironmentConfig, **kwargs: Any) -> None:
        self.config = config_class(**kwargs)
        base = re.sub(r"/v1/?$", "", self.config.base_url.rstrip("/"))
        key = self.config.api_key or os.environ.get("OPENAI_API_KEY", "")
        self._url = f"{base}/env/tools/{self.config.tool}"
        self._client = httpx.Client(headers={"Authorization": f"Bearer {key}"} if key else {},
                                    timeout=self.config.timeout)

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        prefix = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in self.config.env.items()
                         if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name))
        where = cwd or self.config.cwd
        if where:
            prefix += f"cd {shlex.quote(where)} || exit 1\n"
        try:
            response = self._client.post(self._url, json={"command": prefix + command})
        except httpx.HTTPError as exc:
            output = {"output": "", "returncode": -1,
                      "exception_info": f"the gateway could not be reached: {type(exc).__name__}: {exc}"}
            return output
        if response.status_code == 409:  # the environment's episode ended (its turn limit): the run is over
            from minisweagent.exceptions import LimitsExceeded

            raise LimitsExceeded({"role": "exit", "content": "EnvironmentEnded",
                                  "extra": {"exit_status": "EnvironmentEnded", "submission": ""}})
        if response.status_code != 200:
            return {"output": "", "returncode": -1,
                    "exception_info": f"the gateway refused the command ({response.status_code}): {response.text[:2000]}"}
        reply = response.json()
        output = self._result(reply)
        self._check_finished(output)
        return output

    @staticmethod
    def _result(reply: dict[str, Any]) -> dict[str, Any]:
        text = str(reply.get("output", ""))
        if reply.get("error"):  # the tool refused (a bad argument, a lost workspace): shown to the agent
            return {"output": text, "returncode": -1, "exception_info": text}
        if match := _TIMED_OUT.search(text):
            return {"output": text[:match.start()], "returncode": -1, "exception_info": match.group(0).strip()}
        if match := _EXIT_CODE.search(text):
            return {"output": text[:match.start()], "returncode": int(match.group(1)), "exception_info": ""}
        return {"output": "" if text == "(no output)" else text, "returncode": 0, "exception_info": ""}

    def _check_finished(self, output: dict[str, Any]) -> None:
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            from minisweagent.exceptions import Submitted

            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config.model_dump(exclude={"api_key"}), **platform.uname()._asdict(), **os.environ, **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"environment": self.config.model_dump(mode="json", exclude={"api_key"}),
                                    "environment_type": f"{type(self).__module__}.{type(self).__name__}"}}}
