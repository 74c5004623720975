"""The training sample: what the RL core consumes. The noun lives in :mod:`forge_env.types`
(:mod:`forge_env.types.sample`); it is re-exported here, where the RL core imports it from."""

from forge_env.types.sample import InvalidSampleError, MessageLevelTrajectoryError, TrainSample

__all__ = ["InvalidSampleError", "MessageLevelTrajectoryError", "TrainSample"]
