"""Math-v0: math word problems (GSM8K, MATH) graded by math-verify in a worker pool.

An episode is one problem. The model reasons and gives a final answer (in ``\\boxed{}``
by default); the answer is graded in a ``VerifierPool`` process, so a check that hangs
or crashes costs that check (scored 0), never the environment or its event loop. With
``max_attempts > 1`` a wrong answer gets "That is not correct, try again." and another
go; a later success earns less (``attempt_rewards``, by default halving per retry). An
optional ``calculator`` tool can be offered. The rubric reports ``correct``,
``format_ok`` (the answer was marked as the system prompt asks) and ``attempts``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from environments.math.answers import extract_answer, reference_answer
from environments.math.loaders import load_tasks
from environments.math.verify import VerifierPool, shared_pool
from forge_env import AnswerOutcome, EpisodeState, Rubric, TaskError, TextEnv
from forge_env.core.rubric import attempt_reward_schedule
from forge_env.tools.calculator import calculator
from forge_env.types import Message, assistant_message, user_message

AnswerFormat = Literal["boxed", "gsm8k", "any"]

SYSTEM_PROMPTS: dict[str, str] = {
    "boxed": "Solve the problem step by step. Put the final answer in \\boxed{}.",
    "gsm8k": "Solve the problem step by step. End with a line '#### <answer>'.",
    "any": "Solve the problem step by step, then state the final answer.",
}
CALCULATOR_NOTE = " You may use the calculator tool."
RETRY_MESSAGE = "That is not correct, try again."
NO_ANSWER_MESSAGES: dict[str, str] = {
    "boxed": "I could not find a final answer. Put it in \\boxed{} and try again.",
    "gsm8k": "I could not find a final answer. End with '#### <answer>' and try again.",
    "any": "I could not find a final answer. State it clearly and try again.",
}
_FORMAT_SOURCES: dict[str, frozenset[str]] = {
    "boxed": frozenset({"boxed"}),
    "gsm8k": frozenset({"hash"}),
    "any": frozenset({"boxed", "hash", "answer_is"}),
}
_GSM8K_CALC = re.compile(r"<<[^<>]*>>")


def math_rubric(verifier: VerifierPool, answer_format: AnswerFormat = "boxed", format_reward: float = 0.0) -> Rubric:
    """``correct`` (weight 1, graded in ``verifier``), ``format_ok`` (weight ``format_reward``) and
    ``attempts`` (a metric only). The verdict of each check is kept in ``state.data["verdict"]``."""
    allowed = _FORMAT_SOURCES[answer_format]

    async def correct(completion: str, answer: str, state: EpisodeState | None) -> float:
        verdict = await verifier.verify(completion, str(answer))
        if state is not None:
            state.data["verdict"] = verdict.to_dict()
        return float(verdict.correct)

    def format_ok(completion: str) -> float:
        found = extract_answer(completion)
        return float(found is not None and found.source in allowed)

    def attempts(state: EpisodeState | None) -> float:
        return float(state.data.get("attempts", 1)) if state is not None else 1.0

    return Rubric([correct, format_ok, attempts], weights=[1.0, format_reward, 0.0])


class MathEnv(TextEnv):
    """Math word problems with verified answers; see the module docstring.

    Args:
        dataset: ``"gsm8k_sample"`` (bundled, offline), ``"gsm8k"`` / ``"math"`` (hub), a local
            ``.jsonl``/``.json``/``.parquet`` file, or a hub id / dataset directory.
        dataset_options: passed to the loader: ``split``, ``limit``, ``question_field``,
            ``answer_field``, ``id_field``, ``path`` (see ``environments.math.loaders``).
        tasks: use these ``{"question", "answer"}`` tasks instead of a dataset.
        answer_format: ``"boxed"``, ``"gsm8k"`` (``#### 18``) or ``"any"``: what the system prompt
            asks for and what ``format_ok`` checks. Correctness does not depend on it.
        max_attempts: final answers allowed; wrong ones before the last get feedback.
        attempt_rewards: reward factor of a success at attempt 1, 2, ... (default 1, 0.5, 0.25, ...).
        use_calculator: offer the ``calculator`` tool.
        format_reward: weight of ``format_ok`` in the reward (default 0: a metric only).
        verifier: the VerifierPool that grades answers (default: the process-wide ``shared_pool()``).
        system_prompt, max_turns, **kwargs: as for :class:`TextEnv` (``max_turns`` defaults to
            ``max_attempts``, plus 8 tool turns with the calculator).

    Its episodes are plain data (``state.data`` holds the attempts and the last verdict as a dict), so they
    snapshot and restore (``supports_snapshots``).
    """

    supports_snapshots = True

    def __init__(
        self,
        *,
        dataset: str = "gsm8k_sample",
        dataset_options: dict[str, Any] | None = None,
        tasks: Sequence[dict[str, Any]] | None = None,
        answer_format: AnswerFormat = "boxed",
        max_attempts: int = 1,
        attempt_rewards: Sequence[float] | None = None,
        use_calculator: bool = False,
        format_reward: float = 0.0,
        verifier: VerifierPool | None = None,
        system_prompt: str | None = None,
        max_turns: int | None = None,
        **kwargs: Any,
    ):
        if answer_format not in SYSTEM_PROMPTS:
            raise ValueError(f"answer_format must be one of {sorted(SYSTEM_PROMPTS)}, got {answer_format!r}")
        rewards = attempt_reward_schedule(max_attempts, attempt_rewards)
        if tasks is None:
            tasks = load_tasks(dataset, **(dataset_options or {}))
        self.verifier = verifier or shared_pool()
        if system_prompt is None:
            system_prompt = SYSTEM_PROMPTS[answer_format] + (CALCULATOR_NOTE if use_calculator else "")
        if max_turns is None:
            max_turns = max_attempts + (8 if use_calculator else 0)
        kwargs.setdefault("rubric", math_rubric(self.verifier, answer_format, format_reward))
        super().__init__(tasks=[self.validate_task(t) for t in tasks], tools=[calculator] if use_calculator else [],
                         system_prompt=system_prompt, max_turns=max_turns, **kwargs)
        self.answer_format = answer_format
        self.max_attempts = max_attempts
        self.attempt_rewards = rewards

    def validate_task(self, task: dict[str, Any]) -> dict[str, Any]:
        task = super().validate_task(task)
        if not isinstance(task.get("question"), str) or task.get("answer") is None:
            raise TaskError('a math task needs {"question": str, "answer": str} (GSM8K "... #### 18" is fine)')
        return {**task, "answer": str(task["answer"])}

    async def on_final_answer(self, message: Message, state: EpisodeState) -> AnswerOutcome:
        attempt = state.data["attempts"] = state.data.get("attempts", 0) + 1
        assert self.rubric is not None
        result = await self.rubric.score(message.get("content", ""), state.task, state.messages, state)
        solved = result.metrics.get("correct", 0.0) >= 1.0
        if solved or attempt >= self.max_attempts:
            return AnswerOutcome(reward=result.reward * self.attempt_rewards[attempt - 1], done=True,
                                 metrics=result.metrics)
        no_answer = state.data.get("verdict", {}).get("status") == "no_answer"
        feedback = NO_ANSWER_MESSAGES[self.answer_format] if no_answer else RETRY_MESSAGE
        return AnswerOutcome(reward=0.0, done=False, messages=[user_message(feedback)], metrics=result.metrics)

    def expert_action(self, observation: list[Message] | EpisodeState | None = None) -> Message:
        """A reference reply for the running episode (or the given state): the dataset's worked solution
        when it has one (GSM8K), then the answer in the requested format."""
        state = observation if isinstance(observation, EpisodeState) else self.state
        if state is None:
            raise ValueError("expert_action needs a running episode (call reset) or an EpisodeState")
        reference = state.task["answer"]
        answer = reference_answer(reference)
        worked = _GSM8K_CALC.sub("", reference.split("####")[0]).strip() if "####" in reference else ""
        final = {"boxed": f"The answer is \\boxed{{{answer}}}.", "gsm8k": f"#### {answer}",
                 "any": f"The answer is {answer}."}[self.answer_format]
        return assistant_message(f"{worked}\n{final}".strip())
