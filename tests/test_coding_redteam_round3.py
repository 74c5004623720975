"""Red-team round 3 of Coding-v0's reward path and the python tool (issue 29 items 1-3): attacks that worked.

Each test plays the attack as a policy would (the graded fenced block, or tool calls), on the real env and
the real bubblewrap sandbox. The goal of each attack: end its own episode as something other than a
scored one (an exception in the env step or an ``InfraError``: the training loop drops every episode that
does not end ``ok``, so a policy that does it whenever it is unsure is never pushed away from it).

1. On the calls-only path the solution holds the run's nonce and results fd (harness.py says so); a
   record it forged with ``"step": Infinity`` (JSON the host's ``json.loads`` accepts) made the host's
   parser raise ``OverflowError`` out of ``env.astep``.
2. Parallel ``python`` calls of one turn queued on the session, each under a deadline that counts as the
   machine's once passed: the third 10 s cell ended the episode with ``InfraError``.
3. Likewise a harmless ``python`` call waiting for a pool slot that the same turn's ``run_tests`` calls held.
4. A ``python`` cell wrote half a report frame on the REPL's results pipe (the cell holds its write end)
   or closed it, then slept: the session server blocked reading it, the host saw no reply by its deadline
   (limit + 5 s) and counted a lost worker; the probe that decides whose failure it was then had 5 s of the
   tool's 10 s grace left, so on a busy pool (the probe waits for a slot) the episode ended as InfraError.
5. A test of several statements that binds and reads only its own names (``import os`` then ``assert
   os.sep``; ``class A: pass`` then ``assert A``) counted as a test that every answer passes (the rule
   looked at the test as a whole, which read a name it had not bound before).
6. (not fixed) The rollout marks a step that outlives ``step_timeout_s`` (60 s in the training config) as
   ``infra_error``; a turn of tool calls, each within its own deadline, outlives it whenever the policy wants.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from agents.rollout import EpisodeBudget, reset_env, step_env
from agents.trajectory import STATUS_INFRA_ERROR, Trajectory, Turn
from environments.coding import CodingEnv
from environments.coding.steps import assert_steps
from forge_env.sandbox.repl import PythonREPL
from tests.sandbox_support import requires_bwrap, small_sandbox


@pytest.fixture
async def sandbox():
    async with small_sandbox() as sb:
        yield sb


pytestmark = requires_bwrap

TASK = {"task_id": "redteam/reverse", "prompt": "Write reverse_words(s): the words of s in reverse order.",
        "tests": ["assert reverse_words('a b') == 'b a'", "assert reverse_words('x') == 'x'",
                  "assert reverse_words('one two three') == 'three two one'", "assert reverse_words('') == ''"]}

#: Graded code that writes report lines of its own on the calls-only path (nonce and fd from a frame that
#: runs it), each built to make the host's parser raise, then a solution that passes every test.
FORGED_RECORDS = '''
import json, os, sys
frame = sys._getframe(1)
while "results_fd" not in frame.f_locals:  # the harness frame that holds them, however deep
    frame = frame.f_back
nonce, fd = frame.f_locals["nonce"], frame.f_locals["results_fd"]
for line in ('{"step": Infinity, "ok": true}', '{"step": -Infinity, "ok": true}', '{"step": NaN, "ok": true}',
             '{"step": 1e400, "ok": true}', '{"call": 7, "error": ' + "[" * 900 + "]" * 900 + '}'):
    os.write(fd, ("\\n" + nonce + line + "\\n").encode())
def reverse_words(s):
    return " ".join(reversed(s.split()))
'''




def _calls(*calls: tuple[str, str]) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": f"call{i}", "type": "function", "function": {"name": name, "arguments": json.dumps({"code": code})}}
        for i, (name, code) in enumerate(calls)]}


async def test_forged_report_lines_cannot_raise_out_of_grading(sandbox):
    for options in ({"show_tests": 0, "max_attempts": 1}, {"max_attempts": 2}):  # every test graded; the default
        env = CodingEnv(tasks=[TASK], sandbox=sandbox, timeout_s=5, **options)
        await env.areset(options={"task": TASK})
        _, reward, terminated, _, info = await env.astep(f"```python\n{FORGED_RECORDS}\n```")
        # Graded like any answer (its own records only say what a call answered, and it answers right).
        assert terminated and reward == 1.0, (options, info)


async def test_parallel_python_calls_cannot_end_the_episode_as_infra(sandbox):
    # parallel_tool_calls=True on purpose: the python tool itself must hold, whatever the env's default.
    env = CodingEnv(tasks=[TASK], sandbox=sandbox, timeout_s=1, use_python_tool=True, parallel_tool_calls=True)
    await env.areset(options={"task": TASK})
    # Before: each call waited for the one before it under its own 1 + 10 s deadline; the 12th outlived it.
    observation, _, terminated, _, _ = await env.astep(_calls(*[("python", "import time\ntime.sleep(30)")] * 13))
    assert not terminated and len(observation) == 13
    assert "timed out" in observation[0]["content"]
    assert all("one at a time" in message["content"] for message in observation[1:])


async def test_a_python_call_does_not_wait_under_its_deadline_for_this_turns_run_tests(sandbox):
    env = CodingEnv(tasks=[TASK], sandbox=sandbox, timeout_s=1, use_python_tool=True, use_run_tests_tool=True)
    await env.areset(options={"task": TASK})
    # One pool slot: before, the run_tests calls (started first) held it for 12 x 1 s while the python
    # call's 1 + 10 s deadline ran, and the harmless call ended the episode as an infra failure.
    calls = [("run_tests", "import time\ntime.sleep(30)")] * 12 + [("python", "print(6 * 7)")]
    observation, _, terminated, _, _ = await env.astep(_calls(*calls))
    assert not terminated and observation[-1]["content"].strip() == "42"


async def test_a_turn_of_slow_tool_calls_is_not_masked_as_infra_by_the_step_timeout(sandbox):
    # The step timeout is longer than any one call may take (1 s + 10 s grace), as the training config's
    # 60 s is longer than Coding-v0's 10 s + 10 s; the policy simply makes more calls. The turn's tool time
    # (8 s here, 30 s by default) bounds them all together, below the step timeout.
    env = CodingEnv(tasks=[TASK], sandbox=sandbox, timeout_s=1, use_python_tool=True, turn_tool_time_s=8)
    await env.areset(options={"task": TASK})
    budget = EpisodeBudget(step_timeout_s=12.0)
    trajectory = Trajectory(episode_id="redteam")
    turn = Turn(prompt_start=0, gen_start=0, gen_end=0, policy_version=0, finish_reason="stop")
    replies = await step_env(env, _calls(*[("python", "import time\ntime.sleep(30)")] * 20), budget, None,
                             trajectory, turn)
    assert trajectory.status != STATUS_INFRA_ERROR, trajectory.error
    texts = [m["content"] for m in replies]
    assert any("this turn's tool time (8 s)" in t for t in texts), texts


async def test_a_step_timeout_below_the_turns_tool_time_is_refused():
    env = CodingEnv(tasks=[TASK], turn_tool_time_s=30)
    with pytest.raises(ValueError, match="must exceed the env's turn_tool_time_s"):
        await reset_env(env, 0, TASK, EpisodeBudget(step_timeout_s=20.0), None, Trajectory(episode_id="x"))


#: Cells that break the REPL's report to its server and sleep: half a frame, a frame of junk, the pipe closed.
BREAK_REPORT = ("import os, struct, time\nfor fd in range(3, 64):\n    try:\n        os.write(fd, {data})\n"
                "    except OSError:\n        pass\ntime.sleep(1000)\n")
REPORT_BREAKERS = (BREAK_REPORT.format(data="struct.pack('>I', 1000)"),
                   BREAK_REPORT.format(data="struct.pack('>I', 3) + b'xyz'"),
                   BREAK_REPORT.replace("os.write(fd, {data})", "os.close(fd)"))


async def test_a_cell_that_breaks_the_repls_report_is_its_own_failure_not_a_lost_worker(sandbox):
    for cell in REPORT_BREAKERS:
        repl = PythonREPL(sandbox, timeout=2)
        try:
            assert (await repl.run("x = 1\nprint(x)")).strip() == "1"
            text = await repl.run(cell)
            # Before: the server blocked on the pipe, the host gave up on the worker after 2 + 5 s.
            assert repl.workers_lost == 0 and sandbox.stats.sandbox_errors == 0, text
            assert "the interpreter ended" in text
            assert "True" in await repl.run("print('x' not in globals())")  # a fresh interpreter, working
        finally:
            await repl.close()


def test_a_test_that_reads_only_names_it_binds_itself_is_not_a_test():
    tests = ["import os\nassert os.sep", "class A:\n    pass\nassert A", "import math\nassert math.isclose(f(1), 2)",
             "x = f(1)\nassert x == 2", "assert f(1) == 2"]
    kept = [step.source.strip() for step in assert_steps(tests) if step.is_test]
    assert kept == ["import math\nassert math.isclose(f(1), 2)", "x = f(1)\nassert x == 2", "assert f(1) == 2"]
    # A test that defines the name it calls tests its own function (and so do the tests after it).
    assert not [step for step in assert_steps(["def f(x):\n    return 1\nassert f(1) == 1"]) if step.is_test]


async def test_a_worker_closed_twice_at_once_closes_cleanly(sandbox):
    # Seen while attacking: a cancelled request's discard and the sandbox's close ran together, and the
    # second close() of the worker raised TypeError (os.close(None)) out of close().
    worker = await sandbox._start_worker("pool")
    results = await asyncio.gather(worker.close(), worker.close(), return_exceptions=True)
    assert results == [None, None]
    assert not worker.alive
