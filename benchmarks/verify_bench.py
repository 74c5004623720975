"""Throughput and latency of answer verification: the VerifierPool against math-verify in-process.

Two workloads: GSM8K replies (integers, from the bundled sample) and LaTeX answers that
need sympy (fractions, roots, sets, percentages). For each it measures, in one run:

- math-verify in-process: ``verify(parse(gold), parse(reply))`` on the main thread, with
  math-verify's own signal-based timeouts (the baseline; it cannot run off the main thread);
- ``grade`` in-process: our extraction + exact number fast path + math-verify;
- the pool: ``await pool.verify_many(...)`` with the checks in worker processes, which
  adds IPC but survives hangs and crashes and never blocks the event loop.

It prints verifications per second with the ratio to the baseline, the p50/p99 latency of
one verification through the pool (sequential calls), and the cost of a hung check
(deadline, then a replacement worker).

    python -m benchmarks.verify_bench [--n 400] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable

from environments.math.grading import grade
from environments.math.loaders import load_gsm8k_sample
from environments.math.verify import VerifierPool


def latex_pairs(n: int) -> list[tuple[str, str]]:
    """Distinct LaTeX answers that need sympy (distinct, so math-verify's parse caches do not flatter it)."""
    pairs = []
    for i in range(n):
        a, b = i % 97 + 2, i % 13 + 3
        kind = i % 5
        if kind == 0:
            pairs.append((f"so the result is $\\boxed{{\\frac{{{a}}}{{{b}}}}}$.", f"{a}/{b}"))
        elif kind == 1:
            pairs.append((f"We get \\boxed{{{a}\\sqrt{{{b}}}}}", f"\\sqrt{{{a * a * b}}}"))
        elif kind == 2:
            pairs.append((f"The answer is \\boxed{{x^2+{2 * a}x+{a * a}}}", f"(x+{a})^2"))
        elif kind == 3:
            pairs.append((f"Final answer: \\boxed{{{a}\\%}}", f"{a / 100}"))
        else:
            pairs.append((f"\\boxed{{\\frac{{{a}}}{{{b}}}}}", f"{a + 1}/{b}"))  # a wrong one
    return pairs


def gsm8k_pairs() -> list[tuple[str, str]]:
    return [(f"Working it out, the total is \\boxed{{{t['answer'].split('####')[-1].strip()}}}.", t["answer"])
            for t in load_gsm8k_sample()]


def workload(pairs: list[tuple[str, str]], n: int) -> list[tuple[str, str]]:
    return [pairs[i % len(pairs)] for i in range(n)]


def math_verify_in_process(reply: str, reference: str) -> bool:
    from math_verify import parse, verify

    gold = reference.split("####")[-1].strip()
    return verify(parse(f"${gold}$"), parse(reply))


def rate_in_process(check: Callable[[str, str], object], items: list[tuple[str, str]]) -> float:
    from math_verify.parser import parse_expr_cached, parse_latex_cached

    parse_latex_cached.cache_clear()  # every method meets the items cold
    parse_expr_cached.cache_clear()
    start = time.perf_counter()
    for reply, reference in items:
        check(reply, reference)
    return len(items) / (time.perf_counter() - start)


async def rate_pool(pool: VerifierPool, items: list[tuple[str, str]]) -> float:
    start = time.perf_counter()
    verdicts = await pool.verify_many(items)
    elapsed = time.perf_counter() - start
    bad = [v for v in verdicts if v.status not in ("correct", "wrong")]
    if bad:
        raise RuntimeError(f"{len(bad)} checks failed in the pool, e.g. {bad[0]}")
    return len(items) / elapsed


async def latencies_pool(pool: VerifierPool, items: list[tuple[str, str]]) -> list[float]:
    times = []
    for reply, reference in items:
        start = time.perf_counter()
        await pool.verify(reply, reference)
        times.append(time.perf_counter() - start)
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def hang_cost(pool: VerifierPool) -> tuple[float, float]:
    start = time.perf_counter()
    verdict = await pool.verify("\\boxed{2^{2^{40}}}", "1")
    killed = time.perf_counter() - start
    assert verdict.status == "timeout", verdict
    start = time.perf_counter()
    await pool.verify_many([("#### 1", "1")] * pool.config.num_workers)  # waits for the replacement
    return killed, time.perf_counter() - start


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=400, help="verifications per workload and method")
    parser.add_argument("--workers", type=int, default=2, help="worker processes in the pool")
    parser.add_argument("--deadline", type=float, default=1.0, help="deadline of the hung check (s)")
    args = parser.parse_args()

    workloads = {"gsm8k (integers)": workload(gsm8k_pairs(), args.n), "latex (sympy)": latex_pairs(args.n)}
    warm_up = gsm8k_pairs()[-20:] + latex_pairs(args.n + 20)[-20:]  # imports and parser set-up, not the items
    rate_in_process(math_verify_in_process, warm_up)
    rate_in_process(grade, warm_up)

    with VerifierPool(num_workers=args.workers, deadline_s=30.0) as pool:
        await pool.verify_many(warm_up)  # workers up and warm
        print(f"verifications/s, n={args.n} per cell, pool of {args.workers} worker processes")
        print(f"{'workload':<18} {'math-verify':>12} {'grade':>14} {'pool':>14}")
        for name, items in workloads.items():
            baseline = rate_in_process(math_verify_in_process, items)
            ours = rate_in_process(grade, items)
            pooled = await rate_pool(pool, items)
            print(f"{name:<18} {baseline:>12.0f} {ours:>8.0f} x{ours / baseline:<4.2f} "
                  f"{pooled:>8.0f} x{pooled / baseline:<4.2f}")
        print("\nlatency of one verification through the pool (sequential calls)")
        fresh = {"gsm8k (integers)": workloads["gsm8k (integers)"], "latex (sympy)": latex_pairs(2 * args.n)[args.n:]}
        for name, items in fresh.items():  # items the workers have not cached yet
            times = await latencies_pool(pool, items[: max(100, args.n // 2)])
            print(f"{name:<18} p50 {1000 * statistics.median(times):6.2f} ms   p99 {1000 * percentile(times, 0.99):6.2f} ms")

    with VerifierPool(num_workers=args.workers, deadline_s=args.deadline) as pool:
        await pool.verify_many([("#### 1", "1")] * args.workers)
        killed, recovered = await hang_cost(pool)
        print(f"\nhung check: verdict 'timeout' after {killed:.2f} s (deadline {args.deadline} s); "
              f"replacement worker serving {recovered:.2f} s later")


if __name__ == "__main__":
    asyncio.run(main())
