"""Start vLLM's own OpenAI-compatible server (``vllm serve``) as a subprocess, with the flags token-level
rollouts need: ``--logprobs-mode processed_logprobs`` (logprobs of the distribution actually sampled, after
temperature/top-k/top-p), and on a CPU build float32, eager mode, block size 32 and an explicit KV-cache size.
Chat-level tool calls need ``--enable-auto-tool-choice --tool-call-parser NAME`` (hermes for Qwen-style models).

Used by the tests and the benchmark on the tiny model; for real deployments run ``vllm serve`` yourself with
the same flags (docs/eval.md lists them).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Flags the CPU build needs (eager: no torch.compile on CPU; block size 32: the CPU attention backend's).
CPU_FLAGS = ("--dtype", "float32", "--enforce-eager", "--block-size", "32")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_command(model: str | Path, *, port: int, served_model_name: str = "tiny", cpu: bool = True,
                   kv_cache_bytes: int = 64 << 20, max_model_len: int = 4096, tool_call_parser: str | None = "hermes",
                   extra_args: tuple[str, ...] = ()) -> list[str]:
    """The command line of a vLLM OpenAI server for token-level rollouts (see the module docstring)."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", served_model_name, "--host", "127.0.0.1", "--port", str(port),
               "--logprobs-mode", "processed_logprobs", "--max-model-len", str(max_model_len),
               "--kv-cache-memory-bytes", str(kv_cache_bytes), "--enable-prompt-tokens-details"]
    if cpu:
        command += CPU_FLAGS
    if tool_call_parser:
        command += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    return command + list(extra_args)


class VLLMServer:
    """A running ``vllm serve`` subprocess on 127.0.0.1 (``base_url``); ``stop()`` ends it and its children."""

    def __init__(self, model: str | Path, *, served_model_name: str = "tiny", port: int | None = None,
                 startup_timeout_s: float = 600.0, **options) -> None:
        self.port = port or free_port()
        self.served_model_name = served_model_name
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log = tempfile.NamedTemporaryFile(prefix="vllm-server-", suffix=".log", delete=False)  # noqa: SIM115
        command = server_command(model, port=self.port, served_model_name=served_model_name, **options)
        # Usage reporting off unless asked for: vLLM's workers post statistics to vLLM's servers by default.
        env = {**os.environ, "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
               "VLLM_NO_USAGE_STATS": os.environ.get("VLLM_NO_USAGE_STATS", "1")}
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
        try:
            self._wait_ready(startup_timeout_s)
        except BaseException:
            self.stop(keep_log=True)  # the error quotes it; its path is in the message's log tail
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}; log:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"vllm serve did not answer within {timeout_s:.0f} s; log:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def stop(self, keep_log: bool = False) -> None:
        """End the server and everything in its process group (the engine core outlives a dead leader)."""
        for signal_number in (15, 9):
            try:
                os.killpg(self.process.pid, signal_number)
            except ProcessLookupError:
                break  # nothing of the group is left
            try:
                self.process.wait(timeout=30)
                if signal_number == 15:
                    os.killpg(self.process.pid, 9)  # stragglers of the group, if any
            except subprocess.TimeoutExpired:
                continue
            except ProcessLookupError:
                pass
            break
        self.log.close()
        if not keep_log:
            Path(self.log.name).unlink(missing_ok=True)

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
