"""A static HTML page showing trajectories turn by turn, with the trained-on tokens highlighted.

``forge-env view FILE.jsonl`` writes it. Each episode shows its task, reward and status,
then the exact token stream: context tokens (prompt, env replies, template markup) in
grey, sampled tokens (``loss_mask == 1``) highlighted, with each turn's policy version.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from itertools import groupby

from agents.trajectory import Trajectory

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 1100px; }
.episode { border: 1px solid #ccc; border-radius: 6px; margin: 1.5em 0; padding: 1em; }
.meta { color: #444; font-size: 0.9em; margin-bottom: 0.6em; }
.tokens { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 0.85em; line-height: 1.5; }
.ctx { color: #777; }
.gen { background: #d9f2d9; color: #000; border-bottom: 2px solid #3a3; }
.turn { font-size: 0.75em; color: #fff; background: #36c; border-radius: 3px; padding: 0 4px; margin: 0 2px; }
.bad { color: #b00; font-weight: bold; }
"""


def _text(value: object) -> str:
    """Any field of a trajectory file, escaped: a file from elsewhere may hold any JSON type in any field."""
    return html.escape(value if isinstance(value, str) else str(value))


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, int | float) and not isinstance(value, bool) else _text(value)


def _token_spans(trajectory: Trajectory, decode: Callable[[list[int]], str]) -> str:
    """Render the token stream as runs of context/sampled text, marking where each turn starts."""
    turn_starts = {turn.gen_start: (index, turn) for index, turn in enumerate(trajectory.turns)}
    pieces: list[str] = []
    keyed = [(i, tok, mask) for i, (tok, mask) in enumerate(zip(trajectory.token_ids, trajectory.loss_mask, strict=True))]
    for mask, run in groupby(keyed, key=lambda item: item[2]):
        run = list(run)
        start = run[0][0]
        if start in turn_starts:
            index, turn = turn_starts[start]
            pieces.append(f'<span class="turn">turn {index + 1} · v{_text(turn.policy_version)} · '
                          f'{_text(turn.finish_reason)}</span>')
        css = "gen" if mask else "ctx"
        text = decode([tok for _, tok, _ in run])
        pieces.append(f'<span class="{css}">{html.escape(text)}</span>')
    return "".join(pieces)


def _message_spans(trajectory: Trajectory) -> str:
    """A message-level episode (played through a chat API, no tokens): its messages, the assistant's highlighted."""
    pieces = []
    for message in trajectory.messages:
        css = "gen" if message.get("role") == "assistant" else "ctx"
        text = message.get("content") or ""
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            text += f"\n[tool call] {function.get('name', '?')}({function.get('arguments', '')})"
        pieces.append(f'<span class="turn">{html.escape(str(message.get("role")))}</span>'
                      f'<span class="{css}">{html.escape(text)}</span>\n')
    return "".join(pieces)


def _body(trajectory: Trajectory, decode: Callable[[list[int]], str] | None) -> str:
    if trajectory.level == "message" or decode is None:
        return _message_spans(trajectory)
    return _token_spans(trajectory, decode)


def render_html(trajectories: Sequence[Trajectory], decode: Callable[[list[int]], str] | None, title: str = "trajectories") -> str:
    """The whole page as a string; ``decode`` turns token ids into text (e.g. ``tokenizer.decode``)."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
             f"<p>{len(trajectories)} episodes. <span class='gen'>Highlighted</span> tokens were sampled by the "
             "policy and are trained on; grey tokens come from the prompt, the environment and the chat template.</p>"]
    for trajectory in trajectories:
        status = _text(trajectory.status) if trajectory.ok else (
            f"<span class='bad'>{_text(trajectory.status)}: {_text(trajectory.error or '')}</span>")
        ending = "terminated" if trajectory.terminated else (
            f"truncated ({_text(trajectory.truncation_reason or '?')})" if trajectory.truncated else "unfinished")
        task = html.escape(json.dumps(trajectory.task, default=str)[:400])
        parts.append(
            f"<div class='episode'><div class='meta'><b>{_text(trajectory.episode_id)}</b> · "
            f"{_text(trajectory.env_id)} · reward <b>{_number(trajectory.reward)}</b> · {ending} · {status} · "
            f"{len(trajectory.turns)} turns · {trajectory.num_sampled_tokens}/{len(trajectory.token_ids)} tokens sampled"
            f"<br>task: <code>{task}</code></div><div class='tokens'>{_body(trajectory, decode)}</div></div>")
    parts.append("</body></html>")
    return "".join(parts)


def write_html(trajectories: Sequence[Trajectory], path: str, decode: Callable[[list[int]], str] | None, title: str = "trajectories") -> str:
    """Write the page to ``path`` and return the path."""
    with open(path, "w", encoding="utf-8") as out:
        out.write(render_html(trajectories, decode, title))
    return path
