"""The environment contract: ``TextEnv``/``ToolEnv``, the registry, rubrics, spaces, demonstrations and ``check_env``.

Everything an environment author subclasses or calls lives here; the public names are
re-exported from ``forge_env`` itself (``from forge_env import TextEnv``).
"""
