"""``Verdict``, the one grading-result noun, lives in :mod:`forge_env.types.verdict`; re-exported here."""

from forge_env.types.verdict import Verdict

__all__ = ["Verdict"]
