"""Terminal-v0: Harbor task directories (Terminal-Bench 2.0's format) in a container, verified apart."""

from environments.terminal.env import BUNDLED_TASKS, TerminalEnv, task_path
from environments.terminal.tasks import TerminalTask, TerminalTaskError, load_task, load_tasks
from environments.terminal.verify import Verdict, read_rewards

__all__ = ["BUNDLED_TASKS", "TerminalEnv", "TerminalTask", "TerminalTaskError", "Verdict", "load_task", "load_tasks",
           "read_rewards", "task_path"]
