"""verifiers environments as forge-env TextEnvs: ``forge_env.make("verifiers:<taskset-id>", **env_args)``.

``env_args`` that are :class:`~forge_env.TextEnv` options (``max_turns``, ``tool_timeout``, ...) or
:class:`VerifiersEnv` options (``limit``) configure the forge-env side; every other argument is a field of the
taskset's own config class (``vf.TasksetConfig`` subclass) and is validated by it. The package behind
``<taskset-id>`` must be installed (``pip install <package>``), as verifiers itself requires.
"""

from __future__ import annotations

import inspect
from typing import Any

from environments.verifiers_env.env import VerifiersEnv
from environments.verifiers_env.loading import VerifiersEnvError, VerifiersUnavailableError, load_taskset
from forge_env import TextEnv

__all__ = ["VerifiersEnv", "VerifiersEnvError", "VerifiersUnavailableError", "load_verifiers_env"]


def _forge_options() -> set[str]:
    names = set(inspect.signature(TextEnv.__init__).parameters) | set(inspect.signature(VerifiersEnv.__init__).parameters)
    return names - {"self", "kwargs", "taskset", "tasks", "tools", "rubric"}


def load_verifiers_env(taskset_id: str, **env_args: Any) -> VerifiersEnv:
    """The installed verifiers taskset ``taskset_id`` as a :class:`VerifiersEnv` (see the module docstring)."""
    forge = _forge_options()
    env_kwargs = {k: v for k, v in env_args.items() if k in forge}
    taskset_args = {k: v for k, v in env_args.items() if k not in forge}
    return VerifiersEnv(load_taskset(taskset_id, taskset_args), name=env_kwargs.pop("name", taskset_id), **env_kwargs)
