"""The test harness that runs inside the sandbox for function tasks (HumanEval style and assert lists).

The solution is loaded into a namespace, then the tests run one by one in it, each reporting on its own
line to stdout as ``<nonce>{json}``: a timeout or crash part-way still leaves the results so far, and only
lines carrying the run's random nonce count, so printing a fake report needs the nonce. What the solution
and tests print is captured (its tail is returned) instead of mixing with the reports. A HumanEval
``check(candidate)`` is split into its statements so that each assert is a test of its own (partial
credit, precise feedback); statements without an assert are setup, and if one fails the rest fail too.

Code running in the same interpreter as its tests can always subvert them (``sys.modules``, frames); the
nonce stops accidental and naive forgeries (an early ``sys.exit(0)`` or ``os._exit(0)`` fails every test),
not a determined attacker.
"""

from __future__ import annotations

import ast
import functools
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One piece of test code run after the solution; ``is_test`` says whether it counts as a test."""

    source: str
    is_test: bool


@functools.lru_cache(maxsize=4096)
def humaneval_steps(test: str, entry_point: str) -> tuple[Step, ...]:
    """Steps for a HumanEval ``test`` (module code defining ``check(candidate)``): the module code, binding
    ``candidate``, then one step per statement of ``check``. Falls back to a single ``check(entry_point)``
    test when ``check`` cannot be split."""
    whole = (Step(f"{test}\ncheck({entry_point})\n", True),)
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return whole
    checks = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "check"]
    if len(checks) != 1 or len(checks[0].args.args) != 1 or checks[0].decorator_list:
        return whole
    check = checks[0]
    module = [node for node in tree.body if node is not check]
    steps = [Step(ast.unparse(ast.Module(body=module, type_ignores=[])) + "\n", False)] if module else []
    steps.append(Step(f"{check.args.args[0].arg} = {entry_point}\n", False))
    for statement in check.body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring or a stray string
        if any(isinstance(node, ast.Return | ast.Yield | ast.YieldFrom | ast.Nonlocal | ast.Global)
               for node in _walk_outside_functions(statement)):
            return whole  # only valid inside a function body
        is_test = any(isinstance(node, ast.Assert) for node in ast.walk(statement))
        steps.append(Step(ast.unparse(statement) + "\n", is_test))
    return tuple(steps) if any(step.is_test for step in steps) else whole


def _walk_outside_functions(node: ast.AST):
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            yield from _walk_outside_functions(child)


def assert_steps(tests: list[str], setup: str | None = None) -> tuple[Step, ...]:
    """Steps for an assert-list task: the optional setup code, then each assert as a test."""
    steps = [Step(setup + "\n", False)] if setup and setup.strip() else []
    return tuple(steps + [Step(test.strip() + "\n", True) for test in tests])


_HARNESS = r'''
import io, json, linecache, os, sys, traceback


class _Tail(io.TextIOBase):
    """Keeps the last ``keep`` characters written (the solution may print a lot)."""

    def __init__(self, keep):
        self.parts, self.size, self.keep = [], 0, keep

    def writable(self):
        return True

    def write(self, text):
        self.parts.append(text)
        self.size += len(text)
        while self.size > 2 * self.keep and len(self.parts) > 1:
            self.size -= len(self.parts.pop(0))
        return len(text)

    def value(self):
        return "".join(self.parts)[-self.keep:]


def _describe(exc):
    # Only the solution's own frames: the failing test is shown separately, the harness is noise.
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == "solution.py"]
    text = "".join(traceback.format_list(frames[-3:]) + traceback.format_exception_only(type(exc), exc))
    return text[-1500:]


def _register(name, source):
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)


def _forge_harness():
    # The payload (solution, tests, nonce) comes on stdin, which is then closed for good: the solution
    # must not be able to read the nonce back.
    payload = json.loads(sys.stdin.buffer.read())
    solution, steps, nonce = payload["solution"], payload["steps"], payload["nonce"]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    results_fd = os.dup(1)
    captured = _Tail(payload["keep"])
    del payload
    sys.stdout = captured

    def emit(record):
        data = ("\n" + nonce + json.dumps(record) + "\n").encode()
        while data:
            data = data[os.write(results_fd, data):]

    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    _register("solution.py", solution)
    failure = None
    try:
        exec(compile(solution, "solution.py", "exec"), namespace)
    except BaseException as exc:  # SystemExit included: the solution may not end the run
        failure = "the solution failed to run: " + _describe(exc)
        emit({"load_error": failure})
    for index, (source, is_test) in enumerate(steps):
        name = f"test_{index}.py"
        _register(name, source)
        if failure is not None:
            emit({"step": index, "ok": False, "error": failure})
            continue
        try:
            exec(compile(source, name, "exec"), namespace)
            emit({"step": index, "ok": True})
        except BaseException as exc:
            error = _describe(exc)
            emit({"step": index, "ok": False, "error": error})
            if not is_test:
                failure = "setup failed: " + error
    emit({"done": True, "output": captured.value()})
'''


def new_nonce() -> str:
    return secrets.token_hex(16)


#: Sandbox prelude defining the harness (built once per worker) and the per-run program calling it;
#: what to test comes on stdin (see harness_input).
HARNESS_PRELUDE = _HARNESS
HARNESS_CALL = "_forge_harness()\n"


def harness_input(solution: str, steps: Sequence[Step], nonce: str, keep_chars: int = 2000) -> str:
    """The harness's stdin: the solution, the steps and the nonce (the program text stays the same, so
    the sandbox does not compile them into it)."""
    return json.dumps({"solution": solution, "steps": [(step.source, step.is_test) for step in steps],
                       "nonce": nonce, "keep": keep_chars})


@dataclass
class HarnessReport:
    """What the harness reported: per-step (ok, error) by index, a load error, captured output, completion."""

    steps: dict[int, tuple[bool, str | None]]
    load_error: str | None
    output: str
    finished: bool


def parse_harness_output(stdout: str, nonce: str) -> HarnessReport:
    """Collect the harness's report lines (those carrying ``nonce``) from the run's stdout."""
    report = HarnessReport(steps={}, load_error=None, output="", finished=False)
    for line in stdout.splitlines():
        if not line.startswith(nonce):
            continue
        try:
            record = json.loads(line[len(nonce):])
        except ValueError:
            continue
        if "step" in record:
            report.steps[int(record["step"])] = (bool(record["ok"]), record.get("error"))
        elif "load_error" in record:
            report.load_error = record["load_error"]
        elif record.get("done"):
            report.finished = True
            report.output = record.get("output", "")
    return report
