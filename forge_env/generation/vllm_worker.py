"""A vLLM worker extension that swaps the running model's weights (used by ``VLLMGenerator``).

vLLM runs its model in worker processes and encodes ``collective_rpc`` arguments with an untyped msgpack
decoder, so tensors never travel through it here: ``collective_rpc("forge_load_weights", args=(path,))``
carries only the path of safetensors weights (a file the ``WeightStore`` or the generator wrote to
/dev/shm, or a checkpoint directory), and each worker maps the file itself without copying.

Loading goes through vLLM's in-place reload (``reload_weights(weights_iterator=..., is_checkpoint_format=
True)``), which re-runs each layer's post-load processing (the CPU backend repacks linear weights for
oneDNN; a plain ``load_weights`` would leave it with stale packed copies). A tied LM head is re-processed
after every load: vLLM skips it as an alias of the embedding, yet on CPU it holds its own packed copy.

If a load fails half way, the worker reloads the weights it served before (kept mapped, so the file may
be deleted meanwhile; the original checkpoint for the first version) and re-raises: the model is never
left mixed.

vLLM's engine-core process outlives the process that started it if that one is killed (its workers follow
the engine core, but the engine core watches nobody). ``VLLMGenerator`` names itself the owner in
``FORGE_VLLM_OWNER_PID``; each worker watches the owner and, when it exits, stops its engine core.
This module is imported by vLLM inside its workers; nothing else imports it.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

logger = logging.getLogger(__name__)

OWNER_ENV = "FORGE_VLLM_OWNER_PID"

class WeightReloadError(RuntimeError):
    """Loading new weights failed; the previous weights were restored (or restoring failed too)."""


class ForgeWorkerExtension:
    """Mixed into vLLM's worker (GPU or CPU) through ``worker_extension_cls``."""

    def forge_load_weights(self, path: str) -> int:
        """Replace the model's weights with the safetensors weights at ``path``; return the tensor count."""
        from forge_env.weights.safetensors_io import map_safetensors

        weights = map_safetensors(path)  # maps every file first: a missing one fails before the model is touched
        try:
            self._forge_reload(self._forge_weights(weights))
        except BaseException as exc:
            self._forge_restore(exc)
            raise WeightReloadError(
                f"loading {path} failed ({type(exc).__name__}: {exc}); the previous weights were restored"
            ) from exc
        self._forge_current = weights  # mapped: survives the file being deleted, for a later restore
        return len(weights)

    def forge_ping(self) -> bool:
        """True: the extension is installed (the generator checks this once at start-up)."""
        return True

    def _forge_weights(self, weights: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
        """The tensors to load, in checkpoint order (the hook a fault-injecting test subclass wraps)."""
        yield from weights.items()

    def _forge_reload(self, weights: Iterable[tuple[str, Any]] | None) -> None:
        """vLLM's in-place reload (``None``: from the original checkpoint), then the tied head re-derived."""
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
        if self._forge_tied():
            # vLLM skips the head as an alias of the embedding, so its processed copy (the CPU backend's
            # packed matmul weight) would keep the old values: rebuild it from the shared parameter.
            head = self.model_runner.get_model().lm_head  # type: ignore[attr-defined]
            head.quant_method.process_weights_after_loading(head)

    def _forge_tied(self) -> bool:
        config = self.model_runner.model_config.hf_text_config  # type: ignore[attr-defined]
        return bool(getattr(config, "tie_word_embeddings", False))

    def _forge_restore(self, cause: BaseException) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = self.model_runner  # type: ignore[attr-defined]
        try:
            # Put every layer back on real storage and clear the half-done reload's bookkeeping first.
            with set_current_vllm_config(self.vllm_config):  # type: ignore[attr-defined]
                finalize_layerwise_reload(runner.get_model(), runner.model_config)
            previous = getattr(self, "_forge_current", None)
            self._forge_reload(None if previous is None else iter(previous.items()))
        except BaseException as exc:
            raise WeightReloadError(
                f"loading new weights failed ({cause!r}) and restoring the previous ones failed too ({exc!r}); "
                "this engine's weights are undefined: shut it down"
            ) from exc
        logger.warning("weight load failed (%r); previous weights restored", cause)



def watch_process(pid: int, on_exit: Callable[[], None]) -> threading.Thread | None:
    """Call ``on_exit`` from a daemon thread once process ``pid`` has exited (at once if it is gone)."""
    try:
        fd = os.pidfd_open(pid)  # race-free: the descriptor names this process, never a reused pid
    except ProcessLookupError:
        on_exit()
        return None

    def wait() -> None:
        select.select([fd], [], [])
        os.close(fd)
        on_exit()

    thread = threading.Thread(target=wait, name=f"forge-watch-{pid}", daemon=True)
    thread.start()
    return thread


def _watch_owner() -> None:
    """Stop the engine core when the process that started it exits: from a worker process (a grandchild of
    the owner) the engine core is our parent; a worker running inside the engine core (vLLM's in-process
    executor, e.g. one GPU) is the engine core itself, a child of the owner."""
    owner = os.environ.get(OWNER_ENV)
    parent = os.getppid()
    if not owner or int(owner) == os.getpid():
        return  # the owner itself: nothing to watch
    engine_core = os.getpid() if int(owner) == parent else parent

    def stop_engine() -> None:
        if engine_core == os.getpid() or os.getppid() == engine_core:  # still that process
            logger.warning("the process that started this vLLM engine (%s) exited; stopping the engine", owner)
            os.kill(engine_core, signal.SIGTERM)
        time.sleep(30)
        os._exit(1)  # the engine core should have closed us by now

    watch_process(int(owner), stop_engine)


_watch_owner()
