"""SWE-v0: repository-level coding tasks (SWE-bench rows) in a per-episode sandboxed workspace."""

from environments.swe.env import SWEEnv
from environments.swe.grading import Grade, grade, split_changes
from environments.swe.repos import BaseCheckout, base_checkout, check_repo
from environments.swe.tasks import SWETask, SWETaskError, load_swe_tasks, parse_task
from forge_env.workspace import Workspace  # re-exported: its home is forge_env.workspace

__all__ = ["BaseCheckout", "Grade", "SWEEnv", "SWETask", "SWETaskError", "Workspace", "base_checkout",
           "check_repo", "grade", "load_swe_tasks", "parse_task", "split_changes"]
