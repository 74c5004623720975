"""A function task's test code as steps: what runs after the solution, and which steps are tests.

A HumanEval ``check(candidate)`` is split into its statements so that each assert is a test of its own
(partial credit, precise feedback); statements without an assert are setup, and if one fails the rest
fail too. An assert-list task is its optional setup followed by one test per assert.

Only a test that depends on the solution is a test: ``assert True`` (HumanEval/113 and /160 end with one),
``assert 1 == 1`` or any assert that reads nothing but builtins, imports and names bound that way passes
whatever the solution does, so it would hand every answer a floor of credit. :func:`depends_on_solution`
tells them apart by following names from statement to statement: a name is *free of the solution* when
it is a builtin, an import, or bound by a statement that reads only such names; everything else (the
solution's names, ``candidate``, what a call to them returned or may have changed, names the test code
does not bind itself) may depend on it. Such constant asserts are dropped (kept as setup only when they
bind a name a later step could read).

Each step records the names it reads and binds, so that a subset of the tests can run without the others
(see :func:`steps_for_tests`: the visible tests of a task run without its held-out ones).
"""

from __future__ import annotations

import ast
import builtins
import functools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from environments.coding.tasks import task_kind

_BUILTINS = frozenset(dir(builtins))
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclass(frozen=True)
class Step:
    """One piece of test code run after the solution; ``is_test`` says whether it counts as a test.

    ``reads``/``binds``: the names it reads from outside and binds (for running a subset of the tests);
    ``dependent``: whether it reads anything that may depend on the solution.
    """

    source: str
    is_test: bool
    reads: frozenset[str] = frozenset()
    binds: frozenset[str] = frozenset()
    dependent: bool = True


def statement_names(node: ast.AST) -> tuple[frozenset[str], frozenset[str]]:
    """(names ``node`` reads from the enclosing scope, names it binds there). Names bound only inside it
    (comprehension and loop targets, parameters of its functions and lambdas) are not counted as read."""
    read, bound, local = set(), set(), set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            (read if isinstance(child.ctx, ast.Load) else bound).add(child.id)
        elif isinstance(child, ast.arg):
            local.add(child.arg)
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(child.name)
        elif isinstance(child, ast.Import | ast.ImportFrom):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in child.names)
        elif isinstance(child, ast.comprehension | ast.For | ast.AsyncFor):
            local.update(n.id for n in ast.walk(child.target) if isinstance(n, ast.Name))
    return frozenset(read - local), frozenset(bound)


def depends_on_solution(statements: Sequence[ast.stmt], solution_names: Iterable[str] = ()) -> list[bool]:
    """For each statement in order, whether it reads a name that may depend on the solution (see the module
    docstring). ``solution_names`` are the solution's names the code uses (``candidate``, the entry point);
    any other name is free of the solution only once a statement free of it has bound it."""
    free = set(_BUILTINS) - set(solution_names)
    flags = []
    for statement in statements:
        dependent = False
        # A module (an assert-list test of several lines, HumanEval's module code) statement by statement:
        # as a whole, ``import os; assert os.sep`` read a name it bound and counted as a test.
        for part in statement.body if isinstance(statement, ast.Module) else [statement]:
            read, bound = statement_names(part)
            if not read <= free:  # what it binds may be the solution's answer; what it reads, changed by it
                dependent = True
                free -= bound | (read - _BUILTINS)
            else:
                free |= bound
        flags.append(dependent)
    return flags


def _step(statement: ast.stmt, source: str, is_test: bool, dependent: bool) -> Step:
    reads, binds = statement_names(statement)
    return Step(source, is_test, reads, binds, dependent)


def _steps(statements: list[ast.stmt], sources: list[str], tests: list[bool], solution_names: Sequence[str]
           ) -> tuple[Step, ...]:
    """Steps of ``statements``, dropping the tests that do not depend on the solution (kept as setup when
    they bind a name)."""
    steps = []
    flags = depends_on_solution(statements, solution_names)
    for statement, source, is_test, dependent in zip(statements, sources, tests, flags, strict=True):
        step = _step(statement, source, is_test and dependent, dependent)
        if is_test and not dependent and not step.binds:
            continue  # a constant assert: not a test, and nothing later can need it
        steps.append(step)
    return tuple(steps)


@functools.lru_cache(maxsize=4096)
def humaneval_steps(test: str, entry_point: str) -> tuple[Step, ...]:
    """Steps for a HumanEval ``test`` (module code defining ``check(candidate)``): the module code, binding
    ``candidate``, then one step per statement of ``check``, constant asserts left out. Falls back to a
    single ``check(entry_point)`` test when ``check`` cannot be split."""
    whole = (Step(f"{test}\ncheck({entry_point})\n", True, frozenset({entry_point}), frozenset({"check"})),)
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return whole
    checks = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "check"]
    if len(checks) != 1 or len(checks[0].args.args) != 1 or checks[0].decorator_list:
        return whole
    check = checks[0]
    parameter = check.args.args[0].arg
    module = [node for node in tree.body if node is not check]
    statements: list[ast.stmt] = []
    sources: list[str] = []
    tests: list[bool] = []
    if module:
        statements.append(ast.Module(body=module, type_ignores=[]))  # type: ignore[arg-type]
        sources.append(ast.unparse(statements[-1]) + "\n")
        tests.append(False)
    statements.append(ast.parse(f"{parameter} = {entry_point}").body[0])
    sources.append(f"{parameter} = {entry_point}\n")
    tests.append(False)
    for statement in check.body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
            continue  # a docstring or a stray string
        if any(isinstance(node, ast.Return | ast.Yield | ast.YieldFrom | ast.Nonlocal | ast.Global)
               for node in _walk_outside_functions(statement)):
            return whole  # only valid inside a function body
        statements.append(statement)
        sources.append(ast.unparse(statement) + "\n")
        tests.append(any(isinstance(node, ast.Assert) for node in ast.walk(statement)))
    return _steps(statements, sources, tests, (parameter, entry_point))


def _walk_outside_functions(node: ast.AST):
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, _SCOPES):
            yield from _walk_outside_functions(child)


def assert_steps(tests: Sequence[str], setup: str | None = None) -> tuple[Step, ...]:
    """Steps for an assert-list task: the optional setup code, then each assert that depends on the
    solution as a test (the solution's names are the ones the code reads and does not bind itself)."""
    return _assert_steps(tuple(tests), setup or "")


@functools.lru_cache(maxsize=4096)
def _assert_steps(tests: tuple[str, ...], setup: str) -> tuple[Step, ...]:
    sources = ([setup + "\n"] if setup.strip() else []) + [test.strip() + "\n" for test in tests]
    statements: list[ast.stmt] = []
    for source in sources:
        try:
            statements.append(ast.Module(body=ast.parse(source).body, type_ignores=[]))  # type: ignore[arg-type]
        except SyntaxError:  # it fails when it runs, as a test of its own
            statements.append(ast.parse("__forge_unparsable__").body[0])
    flags = [True] * len(sources)
    if setup.strip():
        flags[0] = False
    return _steps(statements, sources, flags, ())


def task_steps(task: dict[str, Any]) -> tuple[Step, ...]:
    """The steps of a function task (HumanEval style or assert list)."""
    if task_kind(task) == "humaneval":
        return humaneval_steps(task["test"], task["entry_point"])
    return assert_steps(task["tests"], task.get("setup"))


@functools.lru_cache(maxsize=4096)
def names_used(sources: tuple[str, ...]) -> tuple[str, ...]:
    """Names the test code reads and neither defines nor gets from builtins: what the solution must provide
    (so a solution cannot stand in for ``len`` or ``sorted`` in the tests)."""
    used: set[str] = set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        used.update(node.id for node in ast.walk(tree) if isinstance(node, ast.Name))
    return tuple(sorted(used - _BUILTINS))


def steps_for_tests(steps: Sequence[Step], tests: Collection[int]) -> tuple[tuple[Step, ...], tuple[int, ...]]:
    """The steps to run for the tests numbered ``tests`` (0 = the first test step) without running any other
    test, and the numbers of the tests they hold.

    Left out: every other test; any step that reads a name one left out binds (a test among them is then
    not run either: see the returned numbers); a setup step that depends on the solution (it calls it) and
    binds nothing a step that runs reads, so the solution never sees the arguments of a test left out.
    """
    wanted = set(tests)
    keep = [True] * len(steps)
    hidden: set[str] = set()
    number = -1
    numbers = []
    for position, step in enumerate(steps):
        if step.is_test:
            number += 1
        numbers.append(number if step.is_test else None)
        if (step.is_test and number not in wanted) or step.reads & hidden:
            keep[position] = False
            hidden |= step.binds
    needed: set[str] = set()
    for position in range(len(steps) - 1, -1, -1):
        step = steps[position]
        if keep[position] and not step.is_test and step.dependent and not step.binds & needed:
            keep[position] = False  # it calls the solution for nothing that runs
        if keep[position]:
            needed |= step.reads
    kept = tuple(step for step, wanted_step in zip(steps, keep, strict=True) if wanted_step)
    return kept, tuple(n for n, wanted_step in zip(numbers, keep, strict=True) if wanted_step and n is not None)
