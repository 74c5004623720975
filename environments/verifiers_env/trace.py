"""A forge-env conversation as a verifiers ``Trace``, recorded the way verifiers records one, and scored.

verifiers' interception server records each model call with ``graph.prepare_turn(trace, prompt, tools)``
and ``.commit(response)``: the prompt's messages become nodes (shared prefixes reused), the reply a
``sampled`` node. The adapter replays the episode's messages through the same two calls, one per assistant
turn, so ``trace.messages``, ``trace.last_reply``, ``trace.num_turns``, ``trace.tool_messages`` and the rest
read as they would after verifiers' own rollout; messages after the last reply (tool results of a cut-short
episode) are committed as a prompt that never reached the model, as verifiers does for a refused request.
"""

from __future__ import annotations

import json
from typing import Any

from forge_env.types import Message


def vf_message(vf: Any, message: Message) -> Any:
    """One forge-env (OpenAI chat) message as a typed verifiers message."""
    role = message.get("role")
    content = message.get("content")
    if role == "system":
        return vf.SystemMessage(content=content or "")
    if role == "user":
        return vf.UserMessage(content=content or "")
    if role == "tool":
        return vf.ToolMessage(tool_call_id=message.get("tool_call_id") or "", content=content or "",
                              name=message.get("name"))
    if role == "assistant":
        calls = [vf.ToolCall(id=call.get("id") or f"call_{i}", name=call["function"]["name"],
                             arguments=_arguments_text(call["function"].get("arguments")))
                 for i, call in enumerate(message.get("tool_calls") or [])]
        return vf.AssistantMessage(content=content, reasoning_content=message.get("reasoning_content"),
                                   tool_calls=calls or None)
    raise ValueError(f"a chat message has role system, user, assistant or tool, got {role!r}")


def forge_message(vf: Any, message: Any) -> Message:
    """A typed verifiers message (from a task's prompt) as a forge-env chat message (content as text)."""
    out: dict[str, Any] = {"role": message.role, "content": vf_text(vf, message.content)}
    if message.role == "assistant":
        if message.reasoning_content:
            out["reasoning_content"] = message.reasoning_content
        if message.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in message.tool_calls]
    elif message.role == "tool":
        out["tool_call_id"] = message.tool_call_id
        if message.name:
            out["name"] = message.name
    return out  # type: ignore[return-value]


def vf_text(vf: Any, content: Any) -> str:
    from verifiers.v1.types import content_text

    return content_text(content) if content is not None else ""


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {})


def new_state(task: Any) -> Any:
    """A fresh ``trace.state`` of the task's state type, as verifiers' rollout makes one."""
    from verifiers.v1.state import state_cls

    return state_cls(type(task))()


def record(vf: Any, task: Any, state: Any, messages: list[Message], tool_specs: list[dict[str, Any]],
           opening: int) -> Any:
    """A trace of ``task`` holding ``state`` and ``messages`` (the whole episode so far), one model call per reply.

    The first ``opening`` messages are the task's prompt: an assistant message among them (a few-shot turn) is
    context the model never generated, so it is recorded as prompt, not as a reply (``sampled`` stays False).
    """
    from verifiers.v1 import graph

    trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                     state=state, agent=vf.AgentInfo(config=vf.AgentConfig()))

    tools = [vf.Tool(name=s["function"]["name"], description=s["function"].get("description") or "",
                     parameters=s["function"].get("parameters") or {}) for s in tool_specs]
    typed = [vf_message(vf, m) for m in messages]
    replies = 0
    for i, message in enumerate(typed):
        if i < opening or messages[i].get("role") != "assistant":
            continue
        replies += 1
        response = vf.Response(id=f"turn-{replies}", created=0, model="forge-env", message=message,
                               finish_reason="tool_calls" if message.tool_calls else "stop")
        graph.prepare_turn(trace, typed[:i], tools).commit(response)
    last = max((i for i, m in enumerate(messages) if i >= opening and m.get("role") == "assistant"), default=-1)
    if last < len(typed) - 1:
        graph.prepare_turn(trace, typed, tools).commit_prompt()
    return trace


async def score(trace: Any, task: Any) -> tuple[float, dict[str, float]]:
    """Run the task's rewards and metrics on ``trace`` (``Task.score``, as verifiers does after a rollout).

    Returns ``trace.reward`` (the weighted sum) and forge-env metrics: every metric by name and every reward's
    unweighted score as ``reward/<name>``. A scoring hook that raises is the environment's failure to grade
    this answer: verifiers records it as a rollout error with no reward; here the episode gets 0 and the
    metric ``scoring_error`` = 1, never an infrastructure error that would drop the episode.
    """
    try:
        await task.score(trace)
    except Exception as exc:  # noqa: BLE001 - a broken reward is reported on the episode, not raised
        trace.record_error(exc)
        return 0.0, {"scoring_error": 1.0}
    metrics = {name: float(value) for name, value in trace.metrics.items() if value is not None}
    metrics.update({f"reward/{name}": float(r.score) for name, r in trace.rewards.items() if r is not None})
    return float(trace.reward), metrics
