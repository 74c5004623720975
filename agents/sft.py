"""Supervised warm-up data: chat demonstrations rendered to token-exact training samples.

A demonstration is ``{"messages": [...], "tools": [...]}`` (the layout of chat SFT
datasets and of the environments' ``expert_demonstrations``). Its tokens are the chat
template's rendering; the loss mask is 1 on what the assistant writes, including the
end-of-turn token that stops generation, and 0 on everything else, exactly as in RL
samples, so SFT and RL train the same positions. An assistant message may carry
``"train_prefix_tokens": n``: then only the first ``n`` tokens of that turn are trained on
(for example, to teach a choice, such as answering without tools, without teaching the
answer's content).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from forge_env.chat import ChatRenderer
from forge_env.rl.types import TrainSample


def demonstration_sample(demo: dict[str, Any], renderer: ChatRenderer, end_token_ids: Sequence[int]) -> TrainSample:
    """Render one demonstration; the mask covers each assistant turn up to and including its end token."""
    messages, tools = demo["messages"], demo.get("tools") or None
    token_ids = renderer.render(messages, tools)
    loss_mask = [0] * len(token_ids)
    ends = set(end_token_ids)
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(renderer.render(messages[:index], tools, add_generation_prompt=True))
        stop = len(renderer.render(messages[: index + 1], tools))
        if token_ids[:start] != renderer.render(messages[:index], tools, add_generation_prompt=True):
            raise ValueError("the chat template is not prefix-preserving for this demonstration; cannot mask turns")
        # Template text after the end-of-turn token (e.g. a newline) is never generated.
        while stop > start and token_ids[stop - 1] not in ends:
            stop -= 1
        prefix = message.get("train_prefix_tokens")
        if prefix is not None:
            if not isinstance(prefix, int) or isinstance(prefix, bool) or prefix < 1:
                raise ValueError(f"train_prefix_tokens must be a positive int, got {prefix!r}")
            stop = min(stop, start + prefix)
        loss_mask[start:stop] = [1] * (stop - start)
    return TrainSample(token_ids=token_ids, loss_mask=loss_mask, old_logprobs=[0.0] * len(token_ids),
                       metadata={"source": "demonstration"})


def demonstration_samples(demos: Iterable[dict[str, Any]], renderer: ChatRenderer) -> list[TrainSample]:
    """Render many demonstrations (see :func:`demonstration_sample`); the end token is the tokenizer's eos."""
    tokenizer = renderer.tokenizer
    end_ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if not end_ids:
        raise ValueError("the tokenizer has no eos token: cannot tell where an assistant turn ends")
    return [demonstration_sample(demo, renderer, end_ids) for demo in demos]


def trajectory_demonstrations(trajectories: Iterable[Any], *, min_reward: float | None = None) -> list[dict[str, Any]]:
    """Rejection sampling: the chat demonstrations (``{"messages": [...], "tools": [...]}``, what
    :func:`demonstration_samples` renders) of the ``ok`` episodes in ``trajectories`` whose reward is at least
    ``min_reward`` (all ``ok`` ones when it is ``None``). Read shared rollouts with
    ``agents.trajectory_table.read_trajectories`` (Parquet or JSONL) or ``from_dataset`` first.

    Assistant messages hold the text the model sampled, so on a template that renders them back unchanged the
    demonstration's tokens are the episode's own; where the template re-renders earlier turns (an episode with
    ``drifted`` set) it renders what a server would, not what the model saw: for the exact tokens use
    ``Trajectory.to_samples()`` instead.
    """
    demos = []
    for trajectory in trajectories:
        if not trajectory.ok or (min_reward is not None and trajectory.reward < min_reward):
            continue
        if not any(message.get("role") == "assistant" for message in trajectory.messages):
            continue
        demos.append({"messages": [dict(message) for message in trajectory.messages],
                      "tools": [dict(spec) for spec in trajectory.tools]})
    return demos
