"""The agent gateway: an OpenAI-compatible endpoint in front of any Generator that records token-exact
trajectories of unmodified agent harnesses (see docs/gateway.md)."""

from agents.gateway.capture import HISTORY_EDITED
from agents.gateway.core import (
           AgentGateway,
           EpisodeNotFoundError,
           GatewayConfig,
           GatewayError,
           TooManyEpisodesError,
)

__all__ = ["HISTORY_EDITED", "AgentGateway", "EpisodeNotFoundError", "GatewayConfig", "GatewayError",
           "TooManyEpisodesError"]
