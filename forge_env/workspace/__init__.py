"""Per-episode workspaces and grading in a fresh sandbox: the pieces of a repository-level environment.

- :class:`Workspace` (``workspace.py``): one episode's checkout in a sandbox session of its own, with the
  agent's tools (``bash``, ``view``, ``edit``, ``create``), reset when the agent loses its session, and a
  :class:`Snapshot` of what the agent changed; the helpers it runs are :data:`CELL` (``cell.py``);
  spare sessions started ahead of need (``spares.py``).
- :func:`graded_run` (``graded_runs.py``): a grading run in a fresh sandbox that the graded code cannot
  cancel (a worker lost twice is the code's failure, not the machine's); :func:`retry_machine_failure`, that
  rule for any grading step.
- :func:`read_jsonl` (``datasets.py``): task records, their file hidden from every sandbox.

SWE-v0 (a repository checkout) and Terminal-v0 (a task's container) are built on them.
"""

from forge_env.workspace.cell import CELL
from forge_env.workspace.datasets import read_jsonl
from forge_env.workspace.graded_runs import (
    SANDBOX_ERROR,
    WORKER_LOST,
    GradedRun,
    Retried,
    graded_run,
    retry_machine_failure,
)
from forge_env.workspace.spares import Spares, close_spares, take_session
from forge_env.workspace.workspace import (
    GRACE_S,
    RESET_NOTE,
    Checkout,
    Snapshot,
    Workspace,
    WorkspaceError,
    parse_reply,
)

__all__ = [
    "CELL", "GRACE_S", "RESET_NOTE", "SANDBOX_ERROR", "WORKER_LOST", "Checkout", "GradedRun", "Retried", "Snapshot",
    "Spares", "Workspace", "WorkspaceError", "close_spares", "graded_run", "parse_reply", "read_jsonl",
    "retry_machine_failure", "take_session",
]
