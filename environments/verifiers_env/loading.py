"""Finding a verifiers taskset: the package, its id, its config, and the checks that refuse what cannot map.

verifiers 0.4 (``verifiers.v1``) is the supported API: an environment is an installed package whose
``__all__`` exports one ``vf.Taskset`` subclass, loaded with ``vf.load_taskset(TasksetConfig(id=...))``.
Older verifiers (0.3.x and before: ``vf.Environment``, ``load_environment``) cannot be installed beside
forge-env at all (they pin ``mcp<2``; forge-env's MCP tools need ``mcp>=2``), so they are named in the error.
"""

from __future__ import annotations

import inspect
from importlib.metadata import PackageNotFoundError, version
from typing import Any

SUPPORTED = "0.4"
INSTALL_HINT = ("install it with `make install` (the `verifiers` extra, then `pip install --no-deps verifiers==0.4.0`;"
                " docs/ecosystem.md says why --no-deps)")


class VerifiersUnavailableError(ImportError):
    """The verifiers package is missing, or is a version whose API the adapter does not speak."""


class VerifiersEnvError(ValueError):
    """The verifiers environment cannot be loaded or cannot be played as a TextEnv (the message says why)."""


def import_vf() -> Any:
    """``verifiers.v1``, or a :class:`VerifiersUnavailableError` naming the version found and how to install."""
    try:
        installed = version("verifiers")
    except PackageNotFoundError:
        raise VerifiersUnavailableError(f"the verifiers package is not installed; {INSTALL_HINT}") from None
    if not installed.startswith(SUPPORTED + "."):
        raise VerifiersUnavailableError(
            f"verifiers {installed} is installed, but the adapter speaks the verifiers {SUPPORTED} API "
            f"(`verifiers.v1`: Taskset, TaskData, @vf.reward, vf.Toolset); {INSTALL_HINT}")
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise VerifiersUnavailableError(
            f"verifiers {installed} is installed but `import verifiers.v1` fails: {exc}; {INSTALL_HINT}") from exc
    return vf


def load_taskset(taskset_id: str, taskset_args: dict[str, Any]) -> Any:
    """The taskset ``taskset_id`` built with its own config class from ``taskset_args``; clear errors otherwise."""
    vf = import_vf()
    from pydantic import ValidationError
    from verifiers.v1.utils.loaders import taskset_class

    if not isinstance(taskset_id, str) or not taskset_id.strip():
        raise VerifiersEnvError(f"a verifiers environment id is a taskset package name, got {taskset_id!r}")
    try:
        cls = taskset_class(taskset_id)
    except ModuleNotFoundError as exc:
        raise VerifiersEnvError(f"no verifiers environment {taskset_id!r} is installed: {exc}") from None
    except (AttributeError, TypeError, ValueError) as exc:
        hint = ""
        if hasattr(vf.import_taskset(taskset_id), "load_environment"):
            hint = (" It defines load_environment(), the verifiers 0.3 API (vf.Environment), which forge-env "
                    "does not load: verifiers 0.3 pins mcp<2 and cannot be installed beside forge-env.")
        raise VerifiersEnvError(f"{taskset_id!r} is not a verifiers 0.4 taskset package: {exc}.{hint}") from None
    config_cls = vf.taskset_config_type(taskset_id)
    try:
        config = config_cls.model_validate({**taskset_args, "id": taskset_id})
    except ValidationError as exc:
        raise VerifiersEnvError(f"bad arguments for verifiers environment {taskset_id!r} "
                                f"({config_cls.__name__}): {exc}") from None
    refuse_own_env(vf, taskset_id)
    return cls(config)


def refuse_own_env(vf: Any, taskset_id: str) -> None:
    """A taskset package that exports its own ``vf.Env`` runs several agents (a simulated user, a judge agent):
    forge-env plays one policy against the taskset, so such a package is refused rather than played wrongly."""
    from verifiers.v1.utils.loaders import environment_class

    env_cls = environment_class(taskset_id)
    if env_cls is not vf.SingleAgentEnv:
        raise VerifiersEnvError(
            f"verifiers environment {taskset_id!r} exports its own vf.Env ({env_cls.__name__}), which drives "
            "several agents; the forge-env adapter plays single-agent tasksets only (docs/ecosystem.md)")


def requires_runtime(fn: Any) -> bool:
    """Whether a verifiers hook needs a runtime (a box) to run: verifiers' own test, from ``Task.score``."""
    param = inspect.signature(fn).parameters.get("runtime")
    return param is not None and param.default is inspect.Parameter.empty


def refuse_runtime_tasks(task: Any, taskset_id: str) -> None:
    """Tasks that need a verifiers Runtime (a container, a sandbox) to set up or score cannot be played here:
    verifiers would silently skip their runtime rewards, so they are refused with the hooks named. So are tasks
    whose ``@vf.intercept`` hooks rewrite the model's requests or replies."""
    if getattr(task, "NEEDS_CONTAINER", False):
        raise VerifiersEnvError(
            f"verifiers environment {taskset_id!r} has container tasks ({type(task).__name__}.NEEDS_CONTAINER); "
            "the adapter runs tasks without a verifiers Runtime (use Harbor tasks through Terminal-v0 instead)")
    from verifiers.v1.utils.decorators import discover_decorated

    rewriters = [fn.__name__ for fn in discover_decorated(task, "intercept")]
    if rewriters:  # they rewrite what the model is sent or what it said; forge-env's rollout has no such seam
        raise VerifiersEnvError(
            f"verifiers environment {taskset_id!r} rewrites model requests/responses with @vf.intercept hooks "
            f"{rewriters}; the adapter cannot apply them (the policy's tokens are the trajectory)")
    hooks = [*task.hooks("reward"), *task.hooks("metric")]
    needing = [fn.__name__ for fn in hooks if requires_runtime(fn)]
    needing += [judge.reward_name for judge in task.plugged_judges() if requires_runtime(judge.score)]
    if needing:
        raise VerifiersEnvError(
            f"verifiers environment {taskset_id!r} scores with hooks that need a runtime (a box): {needing}; "
            "the adapter scores without one, so these would be skipped")
