"""Servers for the serving tests, as real processes: ``forge-env serve`` and a plain OpenEnv server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
READY = re.compile(r"on (http://127\.0\.0\.1:\d+)")


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (read from /proc, so it needs no extra package)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class ServerProcess:
    """A server started as a subprocess; ``url`` once it printed its ready line."""

    def __init__(self, argv: list[str], timeout: float = 120.0, preexec_fn=None):
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, preexec_fn=preexec_fn)
        deadline = time.monotonic() + timeout
        self.url = ""
        self.ready_line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            match = READY.search(line)
            if match:
                self.url = match.group(1)
                self.ready_line = line
                return
        self.proc.kill()
        raise AssertionError(f"server did not start: {argv}\n{self.proc.stderr.read()[-3000:]}")

    @classmethod
    def forge(cls, env_id: str, *args: str, preexec_fn=None) -> ServerProcess:
        return cls([sys.executable, "-m", "agents.cli", "serve", env_id, "--port", "0", *args], preexec_fn=preexec_fn)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.stdout.close()
            self.proc.stderr.close()
