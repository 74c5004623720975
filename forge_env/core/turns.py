"""The turn rules of :class:`~forge_env.core.env.TextEnv`: reading an action, answering its tool calls, and
the limits that cut an episode short.

An action (raw text parsed with the env's tool-call parser, or a message dict) becomes an assistant message
plus a list of problems; each tool call is validated, run under its timeout (concurrently when allowed),
and answered in call order by a ``tool`` message whose output is cut past ``max_tool_output_chars`` with a
marker. A tool's error, timeout or bug is an ``Error:`` observation for the model; only an
:class:`~forge_env.tools.InfraError` (the machine failed) propagates. ``TurnRules`` is a mixin: ``TextEnv``
holds the options and the episode state and calls these from ``astep``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from forge_env.core.episode import EpisodeState
from forge_env.tools import InfraError, ToolArgumentError, ToolError
from forge_env.types import (
    Message,
    MessageFormatError,
    ToolCall,
    content_text,
    tool_message,
    validate_message,
)

TRUNCATION_MARKER = "\n[... output truncated: {dropped} more characters]"


class TurnRules:
    """Action normalisation, tool-call execution, output truncation and the truncation reasons (mixin)."""

    def _normalise_action(self, action: Any) -> tuple[Message, list[str]]:
        """Turn a raw string or message dict into an assistant message plus a list of problems found."""
        errors: list[str] = []
        if isinstance(action, str):
            if len(action) > self.max_action_chars:
                return ({"role": "assistant", "content": action[: self.max_action_chars]},
                        [f"your message is {len(action)} characters; the limit is {self.max_action_chars}"])
            parsed = self.parse_action_text(action)
            message: Message = {"role": "assistant", "content": parsed.content}
            if parsed.reasoning is not None:
                message["reasoning_content"] = parsed.reasoning
            if parsed.tool_calls:
                message["tool_calls"] = parsed.tool_calls
            errors.extend(parsed.errors)
            raw_empty = not action.strip()
        else:
            try:
                validate_message(action)
            except MessageFormatError as exc:
                return {"role": "assistant", "content": ""}, [f"invalid action: {exc}"]
            text = content_text(action.get("content"))  # list-of-parts content (openai SDK) becomes its text
            if action["role"] != "assistant":
                return {"role": "assistant", "content": text}, [
                    f"invalid action: the role must be 'assistant', got {action['role']!r}"]
            message = {"role": "assistant", "content": text}
            if action.get("tool_calls"):
                message["tool_calls"] = [dict(c) for c in action["tool_calls"]]  # type: ignore[misc]
            if len(message["content"]) > self.max_action_chars:
                errors.append(f"your message is {len(message['content'])} characters; the limit is {self.max_action_chars}")
                message = {"role": "assistant", "content": message["content"][: self.max_action_chars]}
            raw_empty = not message["content"].strip() and not action.get("tool_calls")
        if raw_empty and not errors:
            errors.append("your message was empty; answer the question or call a tool")
        return message, errors

    async def _answer_tool_calls(self, calls: list[ToolCall], state: EpisodeState, errors: list[str]) -> list[Message]:
        """Execute the calls (concurrently if allowed) and return one tool message per call, in call order."""
        budget_left = None if self.max_tool_calls is None else max(self.max_tool_calls - state.tool_calls, 0)
        turn_budget = getattr(self, "turn_tool_time_s", None)
        deadline = None if turn_budget is None else asyncio.get_running_loop().time() + turn_budget
        jobs = []
        for index, call in enumerate(calls):
            if budget_left is not None and index >= budget_left:
                jobs.append(_constant(f"Error: tool-call budget of {self.max_tool_calls} calls per episode is used up"))
            else:
                jobs.append(self._execute_call(call, deadline))
        state.tool_calls += len(calls)
        if self.parallel_tool_calls:
            outputs = await asyncio.gather(*jobs)
        else:
            outputs = [await job for job in jobs]
        replies = []
        for call, (text, failed) in zip(calls, outputs, strict=True):
            state.tool_errors += failed
            function = call.get("function", {})
            replies.append(tool_message(text, call.get("id", ""), function.get("name", "")))
        return replies

    async def _execute_call(self, call: ToolCall, deadline: float | None = None) -> tuple[str, bool]:
        """Run one call, by ``deadline`` (the turn's tool time) at the latest; return (text for the model,
        whether it failed). Raises only ``InfraError``."""
        function = call.get("function", {})
        name = function.get("name", "")
        tool = self._episode_tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self._episode_tools)) or "none"
            return f"Error: unknown tool {name!r}. Available tools: {known}", True
        raw_arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(raw_arguments) if isinstance(raw_arguments, str) else raw_arguments
        except json.JSONDecodeError as exc:
            return f"Error: arguments for {name} are not valid JSON ({exc.msg})", True
        except (RecursionError, ValueError):  # nested past the recursion limit, an integer past the digit limit
            return f"Error: arguments for {name} are nested too deeply or hold a number too large", True
        timeout = tool.timeout if tool.timeout is not None else self.tool_timeout
        cut_by_turn = False
        if deadline is not None:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return (f"Error: tool {name} was not run: this turn's tool time ({self.turn_tool_time_s:g} s) "
                        "is used up"), True
            if remaining < timeout:
                timeout, cut_by_turn = remaining, True
        try:
            result = await asyncio.wait_for(tool(**arguments) if isinstance(arguments, dict)
                                            else _raise_argument_type(name, arguments), timeout)
        except ToolArgumentError as exc:
            return f"Error: {exc}", True
        except ToolError as exc:
            return f"Error: {exc}", True
        except TimeoutError:
            if cut_by_turn:  # the turn's own calls used its time: the policy's doing, never the machine's
                return f"Error: tool {name} was stopped: this turn's tool time ({self.turn_tool_time_s:g} s) ran out", True
            if tool.timeout_is_infra:
                raise InfraError(f"tool {name} outlived its own deadline plus grace ({timeout:g} s): "
                                 "the machine held it up") from None
            return f"Error: tool {name} timed out after {timeout:g} s", True
        except InfraError:
            raise  # the machine failed, not the model: not an observation (see InfraError)
        except Exception as exc:  # a tool's bug is reported to the model, not raised into the episode
            return f"Error: tool {name} raised {type(exc).__name__}: {exc}", True
        return self._truncate_output(_to_text(result)), False

    def _truncate_output(self, text: str) -> str:
        limit = self.max_tool_output_chars
        if len(text) <= limit:
            return text
        return text[:limit] + TRUNCATION_MARKER.format(dropped=len(text) - limit)

    def _truncation_reason(self, state: EpisodeState) -> str | None:
        if state.turn >= self.max_turns:
            return "max_turns"
        if self.max_episode_chars is not None and state.chars > self.max_episode_chars:
            return "max_chars"
        if self.max_episode_tokens is not None and self.token_counter is not None:
            used = sum(self.token_counter(m.get("content") or "") for m in state.messages)
            if used > self.max_episode_tokens:
                return "max_tokens"
        return None



def is_error_message(message: Message) -> bool:
    return message.get("role") == "tool" and (message.get("content") or "").startswith("Error:")


async def _constant(text: str) -> tuple[str, bool]:
    return text, True


async def _raise_argument_type(name: str, arguments: Any) -> Any:
    raise ToolArgumentError(f"{name}: arguments must be a JSON object, got {type(arguments).__name__}")


def _to_text(result: Any) -> str:
    """Tool results become text for the model: strings as they are, everything else as JSON where possible."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except (TypeError, ValueError):
        return str(result)
