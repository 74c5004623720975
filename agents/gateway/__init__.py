"""The agent gateway: an OpenAI-compatible endpoint in front of any Generator that records token-exact
trajectories of unmodified agent harnesses (see docs/gateway.md)."""

from agents.gateway.capture import HISTORY_EDITED, EpisodeCapture, message_key
from agents.gateway.core import (
                                 AgentGateway,
                                 ChatResult,
                                 EpisodeNotFoundError,
                                 GatewayConfig,
                                 GatewayError,
                                 TooManyEpisodesError,
)

__all__ = ["HISTORY_EDITED", "AgentGateway", "ChatResult", "EpisodeCapture", "EpisodeNotFoundError", "GatewayConfig",
           "GatewayError", "TooManyEpisodesError", "message_key"]
