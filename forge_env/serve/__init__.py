"""Deprecated: the OpenEnv server and client are :mod:`forge_env.openenv` now (renamed in issue 41, so that
``serve`` is not confused with ``forge_env.services``). This alias keeps ``from forge_env.serve import
OpenEnvTextEnv`` working, with a ``DeprecationWarning``; the submodules live only under ``forge_env.openenv``.
"""

import warnings

from forge_env.openenv import OpenEnvError, OpenEnvTextEnv

warnings.warn("forge_env.serve is deprecated: import from forge_env.openenv", DeprecationWarning, stacklevel=2)

__all__ = ["OpenEnvError", "OpenEnvTextEnv"]
