"""Harbor task directories for Terminal-v0's tests, built FROM the project's own image (offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forge_env.sandbox.docker import image_name

DATA = "7 11 24\n"  # sums to 42

TASK_TOML = """\
version = "1.0"

[metadata]
difficulty = "easy"
category = "testing"

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 300.0

[environment]
build_timeout_sec = 300.0
memory_mb = 1024
"""

# The verifier: check.py (run by the python3 on PATH) decides; a test.sh or check.py the agent planted, or a
# python3 it put on PATH, would write the reward without looking at the answer.
TEST_SH = """\
#!/bin/bash
cd /app
if python3 /tests/check.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

CHECK_PY = """\
import sys
print("check.py: the task's own")
try:
    answer = open("/app/answer.txt").read().strip()
except OSError:
    answer = None
print("answer:", answer)
sys.exit(0 if answer == "42" else 1)
"""

SOLVE_SH = """\
#!/bin/bash
python3 -c "print(sum(int(x) for x in open('/app/data.txt').read().split()))" > /app/answer.txt
"""


def make_task(root: Path, name: str = "sum-numbers", *, toml: str = TASK_TOML, dockerfile: str | None = None,
              test_sh: str = TEST_SH, files: dict[str, str] | None = None) -> Path:
    """A Harbor task directory under ``root``: sum the numbers in /app/data.txt into /app/answer.txt."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("Write the sum of the whitespace-separated integers in /app/data.txt "
                                         "to /app/answer.txt (just the number).\n")
    (task / "task.toml").write_text(toml)
    (task / "environment" / "Dockerfile").write_text(
        dockerfile or f"FROM {image_name()}\nWORKDIR /app\nCOPY data.txt /app/data.txt\n")
    (task / "environment" / "data.txt").write_text(DATA)
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "tests" / "check.py").write_text(CHECK_PY)
    (task / "solution" / "solve.sh").write_text(SOLVE_SH)
    for rel, text in (files or {}).items():
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
    return task


async def play(env: Any, task: dict[str, Any], *commands: str) -> tuple[float, dict[str, Any], list[str]]:
    """Run ``commands`` through the bash tool, then end the agent's turn; (reward, final info, outputs)."""
    from tests.swe_support import call
    await env.areset(options={"task": task})
    outputs: list[str] = []
    reward, info = 0.0, {}
    for turn in [*(call("bash", command=c) for c in commands), {"role": "assistant", "content": "done"}]:
        observation, reward, terminated, truncated, info = await env.astep(turn)
        outputs.extend(m.get("content") or "" for m in observation)
        if terminated or truncated:
            break
    return reward, info, outputs
