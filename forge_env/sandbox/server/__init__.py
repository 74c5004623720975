"""The fork server that runs inside every sandbox worker (standard library only).

Its parts are modules of this package so each has one job, but the server runs inside the sandbox as a
single ``python -c`` program: :func:`server_source` concatenates them in dependency order, dropping the
package-relative imports (every part then shares one namespace).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

#: The parts, each after the parts it imports from.
PARTS = ("wire", "procs", "wipe", "child", "zygote", "capture", "runs", "repl", "main")
_RELATIVE_IMPORT = re.compile(r"^from \.\w* import (\([^)]*\)|[^\n]*)\n", re.MULTILINE)


@functools.lru_cache(maxsize=1)
def server_source() -> str:
    """The fork server as one program."""
    here = Path(__file__).parent
    return "\n\n".join(_RELATIVE_IMPORT.sub("", (here / f"{part}.py").read_text()) for part in PARTS)
