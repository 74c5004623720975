"""Token-exact trajectories. The noun (``Trajectory``, ``Turn``, the statuses, the JSONL round trip) lives in
:mod:`forge_env.types` (:mod:`forge_env.types.trajectory`) so SDK code can speak of one; it is re-exported
here, where the app side imports it from. The rollout loop that fills one is :mod:`agents.rollout`.
"""

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

__all__ = ["ERROR_ENDPOINT", "ERROR_INTERNAL", "LEVEL_MESSAGE", "LEVEL_TOKEN", "STATUS_ERROR", "STATUS_INFRA_ERROR",
           "STATUS_OK", "Trajectory", "Turn", "read_jsonl", "write_jsonl"]
