"""The test harness that runs inside the sandbox for function tasks (HumanEval style and assert lists).

Two processes, so that the graded code cannot touch its grading:

- the *judge* runs the (trusted) test code and reports results on its stdout, the only channel the sandbox
  server reads. It makes itself undumpable first (nothing of its uid may read its memory or fds), forks the
  candidate *before* it reads the tests, then reads them from stdin;
- the *candidate* runs the solution. It never holds the judge's stdout, the tests, the nonce or the
  judge's frames, and its own prints go to a pipe the judge keeps the tail of.

The test code calls the solution's functions through proxies: arguments and return values cross as JSON
(None, bool, int, float, str, bytes, complex, and lists, tuples, dicts, sets of these), so every
comparison runs in the judge on plain values it decoded itself. An object with a forged ``__eq__``, a
replaced ``builtins.exec`` or a walk up the call stack stays in the candidate's process and changes no
result; a solution function returning anything else (an instance of its own class, a generator) fails
the test that called it. For HumanEval tasks the judge also runs the task's prompt, so helpers the tests
use (``poly``, ``encode_cyclic``) are the task's, not the solution's.

Each test reports on its own line to stdout as ``<nonce>{json}``: a timeout or crash part-way still leaves
the results so far. What the steps are (one per statement of a HumanEval ``check``, constant asserts left
out) is ``environments.coding.steps``'s business.

Tasks whose every test is one call with constant arguments (``assert f(1, "a") == [2]``, ``f(3 * 19)``,
``abs(f(1.33) - 0.33) < 1e-6``: ``literals.py`` folds them on the host) take a cheaper
*calls-only* path instead (``_forge_calls``): one process loads the solution and makes the calls, and the
host compares the answers with the expected values, which never enter the sandbox. There the solution's
process holds the run's nonce and the results fd, so it can write records of its own: a record can only
say what a call answered, which is what the host grades anyway, and a solution that does not load (a
syntax error, an exception or ``SystemExit`` at import) passes nothing.
"""

from __future__ import annotations

import ast
import functools
import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from environments.coding.literals import NOT_CONSTANT, constant
from environments.coding.sandbox_harness import decode_value, encode_value
from environments.coding.steps import Step


@functools.lru_cache(maxsize=4096)
def trusted_prompt_code(prompt: str, entry_point: str) -> str:
    """What the judge runs of a HumanEval prompt: everything but the function to write (its imports and
    helpers such as ``poly``), or nothing when that is only imports (the tests bring their own)."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return ""
    kept = [node for node in tree.body if not (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                                                and node.name == entry_point)]
    if all(isinstance(node, ast.Import | ast.ImportFrom | ast.Expr) for node in kept):
        kept = [node for node in kept if not isinstance(node, ast.Expr)]
        if all(isinstance(node, ast.ImportFrom) and node.module == "typing" for node in kept):
            return ""
    return ast.unparse(ast.Module(body=kept, type_ignores=[])) + "\n"


def new_nonce() -> str:
    return secrets.token_hex(16)


#: Sandbox prelude defining the harness (built once per worker) and the per-run programs calling it;
#: what to test comes on stdin (see harness_input and calls_input).
HARNESS_PRELUDE = Path(__file__).with_name("sandbox_harness.py").read_text()
HARNESS_CALL = "_forge_harness()\n"
CALLS_CALL = "_forge_calls()\n"


@dataclass(frozen=True)
class StaticTest:
    """A test that is a single call with constant arguments (literals, or arithmetic on them: see
    ``literals.py``), checked on the host.

    ``check``: "eq" (``== expected``), "is" (``is expected``), "true", "false" (the result's truth),
    "tuple_eq" (``tuple(result) == expected``), "close" (``abs(result - value) < tol``, or ``<=`` when
    inclusive; ``expected`` is ``(value, tol, inclusive)``).
    """

    name: str
    args: tuple
    kwargs: tuple[tuple[str, Any], ...]
    check: str
    expected: Any = None


def static_tests(steps: Sequence[Step], callables: Mapping[str, str]) -> tuple[StaticTest, ...] | None:
    """One StaticTest per test step when every test is ``assert f(<constants>) == <constant>`` (or ``is``,
    ``not f(...)``, ``f(...)``, ``tuple(f(...)) == ...``, ``abs(f(...) - <constant>) < <constant>``) with ``f``
    in ``callables`` (test name -> solution name); None when any test needs the judge (loops, helpers, other
    builtins around the call)."""
    return _static_tests(tuple(steps), tuple(sorted(callables.items())))


@functools.lru_cache(maxsize=4096)
def _static_tests(steps: tuple[Step, ...], callables: tuple[tuple[str, str], ...]) -> tuple[StaticTest, ...] | None:
    found = []
    # The builtins a static test may use (abs, tuple, list) must be the builtins: not the solution's
    # functions, and not rebound by the task's own setup steps (which the calls-only path does not run).
    shadowed = set(dict(callables)) | (_names_in(step.source for step in steps if not step.is_test) & _STATIC_BUILTINS)
    for step in steps:
        if step.is_test:
            test = _static_test(step.source, dict(callables), frozenset(shadowed))
            if test is None:
                return None
            found.append(test)
    return tuple(found)


_STATIC_BUILTINS = frozenset({"abs", "tuple", "list"})


def _names_in(sources: Iterable[str]) -> set[str]:
    """Every name the code mentions (read, bound, imported, defined): a superset of what it may rebind."""
    names: set[str] = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            return set(_STATIC_BUILTINS)
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.alias):
                names.update(filter(None, (node.asname, node.name.split(".")[0])))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def _static_test(source: str, callables: Mapping[str, str], shadowed: frozenset[str]) -> StaticTest | None:
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return None
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        return None
    test = body[0].test  # (an assert's message only matters when it fails, and then the test failed)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _static_call(test.operand, callables, shadowed, "false")
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq | ast.Is):
        expected = constant(test.comparators[0], shadowed)
        if expected is NOT_CONSTANT or (isinstance(test.ops[0], ast.Is) and expected not in (True, False, None)):
            return None
        if isinstance(test.ops[0], ast.Eq) and _builtin_call(test.left, "tuple", shadowed):
            return _static_call(test.left.args[0], callables, shadowed, "tuple_eq", expected)
        return _static_call(test.left, callables, shadowed, "eq" if isinstance(test.ops[0], ast.Eq) else "is", expected)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Lt | ast.LtE):
        return _static_closeness(test.left, test.comparators[0], isinstance(test.ops[0], ast.LtE), callables, shadowed)
    return _static_call(test, callables, shadowed, "true")


def _builtin_call(node: ast.AST, name: str, shadowed: frozenset[str]) -> bool:
    """``node`` is ``name(<one argument>)`` with ``name`` the builtin (not in ``shadowed``)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
            and name not in shadowed and len(node.args) == 1 and not node.keywords)


def _static_closeness(left: ast.AST, bound: ast.AST, inclusive: bool, callables: Mapping[str, str],
                      shadowed: frozenset[str]) -> StaticTest | None:
    """``abs(f(<constants>) - <constant>) < <constant>`` (floating-point answers)."""
    if not (_builtin_call(left, "abs", shadowed) and isinstance(left.args[0], ast.BinOp)
            and isinstance(left.args[0].op, ast.Sub)):
        return None
    value, tolerance = constant(left.args[0].right, shadowed), constant(bound, shadowed)
    if not all(isinstance(x, int | float) for x in (value, tolerance)):
        return None
    return _static_call(left.args[0].left, callables, shadowed, "close", (value, tolerance, inclusive))


def _static_call(node: ast.AST, callables: Mapping[str, str], shadowed: frozenset[str], check: str,
                 expected: Any = None) -> StaticTest | None:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in callables):
        return None
    args = tuple(constant(arg, shadowed) for arg in node.args)
    kwargs = tuple((kw.arg, constant(kw.value, shadowed)) for kw in node.keywords)
    if NOT_CONSTANT in args or any(k is None or v is NOT_CONSTANT for k, v in kwargs):
        return None
    return StaticTest(callables[node.func.id], args, kwargs, check, expected)


def calls_input(solution: str, tests: Sequence[StaticTest], nonce: str, keep_chars: int = 2000) -> str:
    """The stdin of ``_forge_calls``: the solution and the calls (never the expected values)."""
    return (f'{{"solution": {json.dumps(solution)}, "calls": {_calls_json(tests)}, "nonce": {json.dumps(nonce)}, '
            f'"keep": {int(keep_chars)}}}')


_CALLS_JSON: dict[int, tuple[Sequence[StaticTest], str]] = {}


def _calls_json(tests: Sequence[StaticTest]) -> str:
    """The calls as JSON, encoded once per tuple of tests (``static_tests`` returns the same tuple for a task
    every time, and a task is graded many times: encoding its arguments cost ~0.1 ms of each check)."""
    cached = _CALLS_JSON.get(id(tests))
    if cached is not None and cached[0] is tests:
        return cached[1]
    text = json.dumps([(t.name, encode_value(list(t.args)), {k: encode_value(v) for k, v in t.kwargs}) for t in tests])
    if isinstance(tests, tuple):  # (immutable: safe to reuse; the entry keeps it alive, so its id stays its own)
        if len(_CALLS_JSON) >= 4096:
            _CALLS_JSON.pop(next(iter(_CALLS_JSON), None), None)  # (another thread may have taken it)
        _CALLS_JSON[id(tests)] = (tests, text)
    return text


def judge_static(test: StaticTest, record: dict | None) -> tuple[bool, str | None]:
    """(passed, error) of one StaticTest from the sandbox's record of its call, compared here on the
    plain value decoded from it."""
    if record is None:
        return False, None
    if "value" not in record:
        error = record.get("error")  # a str from the harness; the solution may write any JSON there
        return False, (error if type(error) is str and error else "the call failed")[-1500:]
    try:
        got = decode_value(record["value"])
    except (ValueError, TypeError, RecursionError):
        return False, "the solution's result could not be decoded\n"
    try:  # (got is built of builtin types only: no comparison here runs the solution's code)
        if test.check == "eq":
            ok = got == test.expected
        elif test.check == "is":
            ok = got is test.expected
        elif test.check == "tuple_eq":
            ok = tuple(got) == test.expected
        elif test.check == "close":
            value, tolerance, inclusive = test.expected
            distance = abs(got - value)
            ok = distance <= tolerance if inclusive else distance < tolerance
        else:
            ok = bool(got) == (test.check == "true")
        ok = bool(ok)
    except (TypeError, ValueError, ArithmeticError, RecursionError, MemoryError) as exc:  # as the judge would raise
        return False, f"{type(exc).__name__}: {exc}\n"[:1500]
    return ok, None if ok else "AssertionError\n"


def harness_input(solution: str, steps: Sequence[Step], nonce: str, keep_chars: int = 2000, *,
                  trusted: str = "", exposed: Sequence[str] | None = None) -> str:
    """The harness's stdin: the solution, the steps and the nonce (the program text stays the same, so
    the sandbox does not compile them into it). ``trusted``: task code the judge runs itself (a HumanEval
    prompt: its helpers); ``exposed``: the solution's names the tests may use (None: every name)."""
    return json.dumps({"solution": solution, "steps": [(step.source, step.is_test) for step in steps],
                       "nonce": nonce, "keep": keep_chars, "trusted": trusted,
                       "exposed": None if exposed is None else list(exposed)})


@dataclass
class HarnessReport:
    """What the harness reported: per-step (ok, error) by index, a load error, captured output, completion."""

    steps: dict[int, tuple[bool, str | None]]
    load_error: str | None
    output: str
    finished: bool
    calls: dict[int, dict] = field(default_factory=dict)


def parse_harness_output(stdout: str, nonce: str) -> HarnessReport:
    """Collect the harness's report lines (those carrying ``nonce``) from the run's stdout; malformed
    ones are skipped (in the calls-only mode the solution itself could write such lines)."""
    report = HarnessReport(steps={}, load_error=None, output="", finished=False)
    for line in stdout.splitlines():
        if not line.startswith(nonce):
            continue
        try:
            record = json.loads(line[len(nonce):])
            if not isinstance(record, dict):
                continue
            if "step" in record:
                if type(record["step"]) is not int:
                    continue  # (Infinity parses as a float: int() of it raised OverflowError, uncaught)
                error = record.get("error")
                report.steps[int(record["step"])] = (bool(record["ok"]), None if error is None else str(error))
            elif "call" in record and type(record["call"]) is int:
                report.calls.setdefault(record["call"], record)
            elif "load_error" in record:
                report.load_error = str(record["load_error"])
            elif record.get("done"):
                report.finished = True
                report.output = str(record.get("output", ""))
        except (ValueError, TypeError, KeyError, RecursionError, ArithmeticError, MemoryError):
            continue  # whatever a forged line holds, it must not raise here: that would end the episode
    return report
