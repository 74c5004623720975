"""The process that a ``VerifierPool`` runs checks in (``python -m environments.math.verify_worker``).

Protocol, one JSON object per line: the worker writes ``{"ready": true}`` once its imports
are done, then answers each ``{"payload": {...}}`` read from stdin with ``{"took": true}`` at once
(the pool retries a check on a fresh worker only when its worker died before that line) and then
``{"ok": result}`` or ``{"error": "Type: message"}``. It is single-threaded and never sets signal handlers; the
pool enforces deadlines by killing the whole process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import sys
from collections.abc import Callable
from typing import Any


def resolve(target: str) -> Callable[[dict[str, Any]], Any]:
    """Import ``"package.module:function"``."""
    module_name, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"target must look like 'package.module:function', got {target!r}")
    return getattr(importlib.import_module(module_name), attr)


def _limit_memory(megabytes: int) -> None:
    limit = megabytes * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("target", help="package.module:function called with each payload")
    parser.add_argument("--preload", action="append", default=[], help="module to import before 'ready'")
    parser.add_argument("--memory-limit-mb", type=int, default=0, help="address-space limit (0: none)")
    args = parser.parse_args(argv)

    # Replies go out on a private copy of stdout; anything a library prints lands on stderr.
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    function = resolve(args.target)
    for module in args.preload:
        importlib.import_module(module)
    if args.memory_limit_mb > 0:
        _limit_memory(args.memory_limit_mb)
    channel.write('{"ready": true}\n')
    channel.flush()

    for line in sys.stdin:
        channel.write('{"took": true}\n')  # before the check runs: a death after this is the check's doing
        channel.flush()
        try:
            reply: dict[str, Any] = {"ok": function(json.loads(line)["payload"])}
        except Exception as exc:  # a failed check is a result; the worker stays up for the next one
            reply = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        channel.write(json.dumps(reply) + "\n")
        channel.flush()


if __name__ == "__main__":
    main()
