"""Environments over the network, speaking OpenEnv's wire protocol.

* ``forge-env serve ENV_ID`` (:mod:`forge_env.openenv.server`, :mod:`forge_env.openenv.app`): any registered
  environment served to OpenEnv clients (``GenericEnvClient``, TRL, ...), episodes held by an EnvService;
* :class:`OpenEnvTextEnv` (:mod:`forge_env.openenv.client_env`): any OpenEnv server as a ``TextEnv``.

The wire format lives in :mod:`forge_env.openenv.protocol`. The server side imports FastAPI and Monarch;
importing this package does not (only ``OpenEnvTextEnv``, which needs ``websockets`` and ``httpx``).
"""

from forge_env.openenv.client_env import OpenEnvError, OpenEnvTextEnv

__all__ = ["OpenEnvError", "OpenEnvTextEnv"]
