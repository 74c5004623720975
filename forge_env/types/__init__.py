"""The core nouns, in one place: what environments, rollouts and training say to each other.

- messages (:mod:`forge_env.types.messages`): ``Message``, ``ToolCall``, ``ToolSpec`` in the OpenAI chat
  format, as plain JSON-ready dicts, with their builders and ``validate_message``;
- the episode in an environment (:mod:`forge_env.types.episode`): ``Task`` (a dataset row), ``EpisodeState``
  ``AnswerOutcome`` and ``EpisodeEnd``;
- the grading result (:mod:`forge_env.types.verdict`): ``Verdict``, what every grader returns;
- the episode as played (:mod:`forge_env.types.trajectory`): ``Trajectory``, token-exact and JSON
  round-trippable, with its ``Turn`` spans and statuses;
- the training sample (:mod:`forge_env.types.sample`): ``TrainSample``, what the RL core consumes.

Nothing here imports anything but the standard library (layer 0 of README's architecture table). The
behaviour around the nouns lives with its users: the env contract in ``forge_env.core``, the rollout loop
in ``agents.rollout``, the trainers in ``forge_env.rl``.
"""

from forge_env.types.episode import AnswerOutcome, EpisodeEnd, EpisodeState, Task
from forge_env.types.messages import (
    ROLES,
    FunctionCall,
    FunctionSpec,
    Message,
    MessageFormatError,
    Role,
    ToolCall,
    ToolSpec,
    assistant_message,
    content_text,
    make_tool_call,
    new_call_id,
    system_message,
    tool_message,
    user_message,
    validate_message,
)
from forge_env.types.sample import InvalidSampleError, MessageLevelTrajectoryError, TrainSample
from forge_env.types.trajectory import (
    ERROR_ENDPOINT,
    ERROR_INTERNAL,
    LEVEL_MESSAGE,
    LEVEL_TOKEN,
    STATUS_ERROR,
    STATUS_INFRA_ERROR,
    STATUS_OK,
    Trajectory,
    Turn,
    read_jsonl,
    write_jsonl,
)
from forge_env.types.verdict import Verdict

__all__ = [
    "ERROR_ENDPOINT", "ERROR_INTERNAL", "LEVEL_MESSAGE", "LEVEL_TOKEN", "ROLES", "STATUS_ERROR", "STATUS_INFRA_ERROR",
    "STATUS_OK", "AnswerOutcome", "EpisodeEnd", "EpisodeState", "FunctionCall", "FunctionSpec", "InvalidSampleError", "Message",
    "MessageFormatError", "MessageLevelTrajectoryError", "Role", "Task", "ToolCall", "ToolSpec", "TrainSample",
    "Trajectory", "Turn", "Verdict", "assistant_message", "content_text", "make_tool_call", "new_call_id", "read_jsonl",
    "system_message", "tool_message", "user_message", "validate_message", "write_jsonl",
]
