"""Environments over the network, speaking OpenEnv's wire protocol.

* ``forge-env serve ENV_ID`` (:mod:`forge_env.serve.server`, :mod:`forge_env.serve.app`): any registered
  environment served to OpenEnv clients (``GenericEnvClient``, TRL, ...), episodes held by an EnvService;
* :class:`OpenEnvTextEnv` (:mod:`forge_env.serve.client_env`): any OpenEnv server as a ``TextEnv``.

The wire format lives in :mod:`forge_env.serve.protocol`. The server side imports FastAPI and Monarch;
importing this package does not (only ``OpenEnvTextEnv``, which needs ``websockets`` and ``httpx``).
"""

from forge_env.serve.client_env import OpenEnvError, OpenEnvTextEnv

__all__ = ["OpenEnvError", "OpenEnvTextEnv"]
