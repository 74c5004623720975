"""The agent side: rollouts, trajectories and RL loops."""
