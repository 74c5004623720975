"""check_env: a conformance checker for text environments.

Like ``gymnasium.utils.env_checker.check_env`` for classic environments, it drives an
environment through the contract and raises :class:`EnvCheckError` listing every
violation: return types of ``reset``/``step``, the same seed giving the same episode,
JSON round-trip of observations and info, valid tool schemas, bad actions answered
with error observations (not exceptions), the after-done error, two instances not
sharing state, and, for an env that ``supports_snapshots``, a snapshot restored in the other instance
answering the next turn as the original does.
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable
from typing import Any

from forge_env.core.env import EpisodeEndedError, TextEnv
from forge_env.types import MessageFormatError, validate_message
from forge_env.utils.aio import run_sync


class EnvCheckError(AssertionError):
    """The environment breaks the text-environment contract; the message lists each problem."""


_BAD_ACTIONS: list[tuple[str, Any]] = [
    ("empty text", ""),
    ("malformed tool-call JSON", "<tool_call>{not json</tool_call>"),
    ("unknown tool", '<tool_call>{"name": "no_such_tool_xyz", "arguments": {}}</tool_call>'),
    ("non-object arguments", '<tool_call>{"name": "no_such_tool_xyz", "arguments": [1, 2]}</tool_call>'),
    ("wrong role", {"role": "user", "content": "hi"}),
    ("not a message", {"content": 3}),
]


def _json_roundtrip(value: Any, what: str, problems: list[str]) -> None:
    try:
        if json.loads(json.dumps(value)) != value:
            problems.append(f"{what} changes under a JSON round trip")
    except (TypeError, ValueError) as exc:
        problems.append(f"{what} is not JSON-serialisable: {exc}")


def _check_messages(observation: Any, what: str, problems: list[str]) -> None:
    if not isinstance(observation, list):
        problems.append(f"{what} must be a list of messages, got {type(observation).__name__}")
        return
    for message in observation:
        try:
            validate_message(message)
        except MessageFormatError as exc:
            problems.append(f"{what} holds a malformed message: {exc}")
    _json_roundtrip(observation, what, problems)


def _check_tool_spec(spec: Any, problems: list[str]) -> None:
    function = spec.get("function") if isinstance(spec, dict) else None
    if not isinstance(function, dict) or spec.get("type") != "function":
        problems.append(f"tool spec {spec!r} must be {{'type': 'function', 'function': {{...}}}}")
        return
    if not isinstance(function.get("name"), str) or not function["name"]:
        problems.append(f"tool spec {spec!r} has no name")
    if not isinstance(function.get("description"), str):
        problems.append(f"tool {function.get('name')!r} has no description string")
    parameters = function.get("parameters")
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        problems.append(f"tool {function.get('name')!r}: parameters must be a JSON schema of type 'object'")
    elif not set(parameters.get("required", [])) <= set(parameters.get("properties", {})):
        problems.append(f"tool {function.get('name')!r}: 'required' names properties that do not exist")


def _check_step_result(result: Any, problems: list[str], what: str) -> bool:
    if not (isinstance(result, tuple) and len(result) == 5):
        problems.append(f"{what}: step must return a 5-tuple (obs, reward, terminated, truncated, info)")
        return False
    observation, reward, terminated, truncated, info = result
    _check_messages(observation, f"{what}: observation", problems)
    if not isinstance(reward, int | float) or isinstance(reward, bool):
        problems.append(f"{what}: reward must be a float, got {type(reward).__name__}")
    for flag, name in ((terminated, "terminated"), (truncated, "truncated")):
        if not isinstance(flag, bool):
            problems.append(f"{what}: {name} must be a bool, got {type(flag).__name__}")
    if not isinstance(info, dict):
        problems.append(f"{what}: info must be a dict")
    else:
        _json_roundtrip(info, f"{what}: info", problems)
    return True


async def _acheck(make_env: Callable[[], TextEnv], seed: int, max_steps: int) -> list[str]:
    problems: list[str] = []
    env, twin = make_env(), make_env()
    try:
        observation, info = await env.areset(seed=seed)
        _check_messages(observation, "reset observation", problems)
        if not observation:
            problems.append("reset observation must hold the opening messages (system and/or user prompt)")
        if not isinstance(info, dict) or not isinstance(info.get("tools"), list):
            problems.append('reset info must be a dict with info["tools"] a list of tool specs')
        else:
            _json_roundtrip(info, "reset info", problems)
            for spec in info["tools"]:
                _check_tool_spec(spec, problems)

        episode = (observation, env.state.task if env.state else None)
        again, _ = await twin.areset(seed=seed)
        if (again, twin.state.task if twin.state else None) != episode:
            problems.append("two resets with the same seed gave different opening messages or tasks")
        others = []
        for other_seed in range(seed + 1, seed + 6):
            other_obs, _ = await twin.areset(seed=other_seed)
            others.append((other_obs, twin.state.task if twin.state else None))
        if all(other == episode for other in others) and not (env.tasks is not None and len(env.tasks) < 2):
            warnings.warn("check_env: five other seeds all gave the same episode; is reset ignoring its seed?",
                          stacklevel=2)

        # isolation: stepping one instance must not change the other's episode
        twin_obs, _ = await twin.areset(seed=seed)
        twin_snapshot = copy.deepcopy(twin.state.messages) if twin.state else None

        for name, action in _BAD_ACTIONS:
            await env.areset(seed=seed)
            try:
                result = await env.astep(action)
            except Exception as exc:  # the point of the check
                problems.append(f"bad action ({name}) raised {type(exc).__name__}: {exc}; it must become an error observation")
                continue
            if _check_step_result(result, problems, f"bad action ({name})") and not result[0] and not (result[2] or result[3]):
                problems.append(f"bad action ({name}) got no observation explaining the error")

        await env.areset(seed=seed)
        done, steps = False, 0
        while not done and steps < max_steps:
            result = await env.astep("I do not know.")
            steps += 1
            if not _check_step_result(result, problems, f"step {steps}"):
                break
            done = result[2] or result[3]
        if done:
            try:
                await env.astep("again")
                problems.append("step after the episode ended must raise EpisodeEndedError")
            except EpisodeEndedError:
                pass
            except Exception as exc:
                problems.append(f"step after the episode ended raised {type(exc).__name__}, not EpisodeEndedError")
        else:
            problems.append(f"a plain-text answer repeated {max_steps} times never ended the episode (no max_turns?)")

        if twin.state is None or twin.state.messages != twin_snapshot or twin_obs != observation:
            problems.append("two instances share episode state: stepping one changed the other")
        if env.supports_snapshots:
            problems.extend(await _check_snapshot(env, twin, seed))
    finally:
        await env.aclose()
        await twin.aclose()
    return problems


async def _check_snapshot(env: TextEnv, twin: TextEnv, seed: int) -> list[str]:
    """The episode snapshotted after reset, restored in ``twin`` (reset to another episode first), must answer
    a turn as the original does: what the snapshot misses (state on ``self``, resources) shows up here."""
    await env.areset(seed=seed)
    await twin.areset(seed=seed + 1)
    try:
        snapshot = json.loads(json.dumps(env.snapshot()))
        await twin.arestore(snapshot)
    except Exception as exc:
        return [f"supports_snapshots is set, but snapshot and restore raised {type(exc).__name__}: {exc}"]
    if await twin.astep("I do not know.") != await env.astep("I do not know."):
        return ["a snapshot restored in another instance answers a turn differently from the original: the "
                "episode holds state the snapshot misses (on self, or a resource); set supports_snapshots = False "
                "or carry it in state.data (snapshot_data / restore_data)"]
    return []


def check_env(env: TextEnv | Callable[[], TextEnv], *, seed: int = 0, max_steps: int = 50) -> None:
    """Check an environment against the contract; raise :class:`EnvCheckError` listing all problems.

    Pass a factory (``lambda: make("id")``) or an instance; with an instance, a deep copy made
    before any episode serves as the second instance for the determinism and isolation checks.
    """
    if isinstance(env, TextEnv):
        copies = iter([env, copy.deepcopy(env)])

        def make_env() -> TextEnv:
            return next(copies)
    else:
        make_env = env
    problems = run_sync(_acheck(make_env, seed, max_steps))
    if problems:
        raise EnvCheckError("environment breaks the TextEnv contract:\n- " + "\n- ".join(dict.fromkeys(problems)))
