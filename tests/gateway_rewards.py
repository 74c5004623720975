"""A reward function for ``rollout.source: gateway`` tests, named in configs as ``tests.gateway_rewards:reward``."""


def reward(trajectory, result):
    """Rewards that vary between episodes of a group: the parity of the tokens sampled, if the harness finished."""
    return float(trajectory.num_sampled_tokens % 2) if "done" in result.output else 0.0
