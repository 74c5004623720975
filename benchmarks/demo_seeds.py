"""`forge-env demo` over several seeds and every CPU kernel family this machine offers: does it learn every time?

A tiny model trained on a CPU depends on that CPU's arithmetic, so one demo run on one machine says
little about the next. This runs the demo config as `make demo` does (a fresh process per run), once per
seed (``model.seed`` and ``loop.seed`` both set to it) and per kernel family:

- ``native``: torch's own choice for this CPU (AVX512 on an AVX-512 Xeon, AVX2 on an AVX2-only EPYC);
- ``avx2``: ``ATEN_CPU_CAPABILITY=avx2`` with MKL and oneDNN held to AVX2 as well (offered on a CPU
  with AVX2 whose native family is another);
- ``default``: ``ATEN_CPU_CAPABILITY=default`` (no vector kernels; MKL and oneDNN held to SSE4).

Emulating a kernel family is not another CPU, but it changes the rounding the way another CPU would,
which is what moved the demo's warm-up (issue 28). Per run it prints the held-out success before and
after RL, the gain, the wall time of the whole `forge-env demo` process, the warm-up's end state
(first-turn tool-call rate, mixed steps, steps undone), how many rollout rounds trained, the exit status
and the load average; then min / median / max over the runs and the verdict against the demo's targets
(every run gains >= 20 points, the median >= 30, every run within 600 s).

    python -m benchmarks.demo_seeds                                   # seeds 0-4 x every family (~100 min)
    python -m benchmarks.demo_seeds --seeds 0 1 --kernels avx2        # a part; results append to --results
    python -m benchmarks.demo_seeds --report                          # the table of everything in --results

Runs go one after another (they would compete for the cores): 3.5-6 minutes each on 2 cores with
native or avx2 kernels, 6.5-10 with ``default``. Each appends one JSON line to
``--results`` (default ``runs/demo_seeds/results.jsonl``), so a benchmark can run in parts and
``--report`` summarises them all; ``--fresh`` empties the file first.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_SEEDS = [0, 1, 2, 3, 4]
FAMILIES = ("native", "avx2", "default")
GAIN_MIN, GAIN_MEDIAN, WALL_MAX = 20.0, 30.0, 600.0

#: What each family sets: torch's own vector kernels, and MKL's and oneDNN's (the matmuls) to match.
FAMILY_ENV = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                "ONEDNN_MAX_CPU_ISA": "SSE41"},
}

# The demo as `make demo` runs it (`forge-env demo` calls this function), without depending on where the
# command-line entry point lives.
RUNNER = ("import argparse, sys; from agents.train.commands import demo_command; "
          "sys.exit(demo_command(argparse.Namespace(overrides=sys.argv[1:], print_config=False)))")


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_family() -> str:
    """torch's kernel family on this CPU when nothing is forced (e.g. ``AVX512``, ``AVX2``, ``DEFAULT``)."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip()


def offered_families() -> list[str]:
    """``native`` plus each forced family that this CPU can run and that differs from native."""
    native = native_family().lower()
    families = ["native"]
    if "avx2" in cpu_flags() and native != "avx2":
        families.append("avx2")
    if native != "default":
        families.append("default")
    return families


def run_one(seed: int, family: str, args: argparse.Namespace) -> dict:
    """One `forge-env demo` process; its summary.json and exit status."""
    out_dir = Path(args.out) / f"{family}_seed{seed}"
    overrides = [f"model.seed={seed}", f"loop.seed={seed}", f"loop.output_dir={out_dir}", *args.override]
    env = {**os.environ, **FAMILY_ENV[family]}
    if family == "native":
        env.pop("ATEN_CPU_CAPABILITY", None)
    log = Path(args.out) / f"{family}_seed{seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.perf_counter()
    with log.open("w") as stream:
        process = subprocess.Popen([sys.executable, "-c", RUNNER, *overrides], stdout=stream, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
        try:
            code = process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    wall = time.perf_counter() - started
    record = {"seed": seed, "kernel": family, "exit": code, "wall_s": wall, "load_before": load_before[0],
              "load_after": os.getloadavg()[0], "overrides": args.override, "log": str(log)}
    summary_path = out_dir / "summary.json"
    if code is not None and summary_path.exists() and summary_path.stat().st_mtime >= time.time() - wall - 1:
        summary = json.loads(summary_path.read_text())
        before, after = summary.get("success_before"), summary.get("success_after")
        warmup = summary.get("warmup") or {}
        record.update(
            before=before, after=after,
            gain=None if before is None or after is None else (after - before) * 100,
            tool_rate=warmup.get("tool_rate"), tool_rate_before_mix=warmup.get("tool_rate_before_mix"),
            mixed_steps=warmup.get("mixed_steps"), mixed_backoffs=warmup.get("mixed_backoffs"),
            sft_steps=warmup.get("steps"), steps=summary["state"]["step"], steps_planned=summary.get("steps_planned"),
            rounds=summary.get("rounds"), rounds_skipped=summary.get("rounds_skipped"),
            rl_stopped=summary.get("rl_stopped"), machine=summary.get("machine"), demo_wall_s=summary.get("wall_s"))
    return record


def _pct(value: float | None) -> str:
    return "   n/a" if value is None else f"{value * 100:5.1f}%"


def describe(record: dict) -> str:
    status = "timeout" if record["exit"] is None else f"exit {record['exit']}"
    gain = record.get("gain")
    rounds = (f"{record.get('steps')}/{record.get('steps_planned')} steps, {record.get('rounds')} rounds "
              f"({record.get('rounds_skipped')} skipped)") if record.get("rounds") is not None else "no summary"
    warm = (f"tool rate {_pct(record.get('tool_rate_before_mix'))} -> {_pct(record.get('tool_rate'))} in "
            f"{record.get('mixed_steps') or 0:.0f} steps ({record.get('mixed_backoffs') or 0:.0f} undone)"
            if record.get("tool_rate") is not None else "no warm-up figures")
    return (f"seed {record['seed']}  {record['kernel']:7s}  before {_pct(record.get('before'))}  after "
            f"{_pct(record.get('after'))}  gain {'  n/a' if gain is None else f'{gain:+5.1f}'}  "
            f"wall {record['wall_s']:5.0f}s  {warm}  {rounds}  {status}  load {record['load_before']:.1f}->"
            f"{record['load_after']:.1f}")


def report(records: list[dict]) -> bool:
    """The table, min / median / max, and whether the demo's targets hold for every run."""
    print(f"\n{len(records)} runs")
    for record in records:
        print("  " + describe(record))
    machines = sorted({r["machine"] for r in records if r.get("machine")})
    for machine in machines:
        print(f"machine: {machine}")

    def spread(key: str, scale: float = 1.0, unit: str = "") -> str:
        values = [r[key] * scale for r in records if r.get(key) is not None]
        if not values:
            return "n/a"
        return (f"{min(values):.1f}{unit} / {statistics.median(values):.1f}{unit} / {max(values):.1f}{unit}")

    print("min / median / max:")
    print(f"  before RL      {spread('before', 100, '%')}")
    print(f"  after RL       {spread('after', 100, '%')}")
    print(f"  gain (points)  {spread('gain')}")
    print(f"  wall           {spread('wall_s', 1, ' s')}")
    print(f"  warm-up end tool-call rate  {spread('tool_rate', 100, '%')}")
    def name(r: dict) -> str:
        return f"seed {r['seed']} {r['kernel']}"

    gains = [r.get("gain") for r in records]
    misses = [f"{name(r)} exited {'by timeout' if r['exit'] is None else r['exit']}" for r in records if r["exit"] != 0]
    misses += [f"{name(r)} gained {r.get('gain')}" for r in records
               if r["exit"] == 0 and (r.get("gain") is None or r["gain"] < GAIN_MIN)]
    misses += [f"{name(r)} took {r['wall_s']:.0f} s" for r in records if r["wall_s"] > WALL_MAX]
    known = [g for g in gains if g is not None]
    if not known or len(known) < len(gains) or statistics.median(known) < GAIN_MEDIAN:
        misses.append(f"median gain {statistics.median(known) if known else float('nan'):.1f}")
    print(f"targets (every gain >= {GAIN_MIN:.0f}, median >= {GAIN_MEDIAN:.0f}, every run <= {WALL_MAX:.0f} s, "
          f"exit 0): " + ("MET" if not misses else "NOT MET: " + "; ".join(misses)))
    return not misses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=DEFAULT_SEEDS)
    parser.add_argument("--kernels", nargs="+", choices=FAMILIES,
                        help="kernel families to run (default: every one this CPU offers)")
    parser.add_argument("--out", default="runs/demo_seeds", help="where each run's outputs and log go")
    parser.add_argument("--results", help="JSON lines, one per run, appended (default: OUT/results.jsonl)")
    parser.add_argument("--fresh", action="store_true", help="empty --results first")
    parser.add_argument("--report", action="store_true", help="only summarise what --results holds")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds before a run is killed")
    parser.add_argument("--override", action="append", default=[], metavar="key.sub=value",
                        help="an extra demo config override for every run (repeatable)")
    args = parser.parse_args(argv)
    results = Path(args.results or Path(args.out) / "results.jsonl")
    if args.report:
        records = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
        return 0 if report(records) else 1
    families = args.kernels or offered_families()
    unknown = sorted(set(families) - set(offered_families()))
    if unknown:
        print(f"note: this CPU does not offer {unknown} as a separate family (same as native, or unsupported); "
              "running them anyway", file=sys.stderr)
    results.parent.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        results.write_text("")
    print(f"{len(args.seeds)} seeds x {families} on {native_family()} kernels natively; one run at a time; "
          f"results -> {results}", flush=True)
    records = []
    for family in families:
        for seed in args.seeds:
            record = run_one(seed, family, args)
            records.append(record)
            with results.open("a") as stream:
                stream.write(json.dumps(record) + "\n")
            print(describe(record), flush=True)
    return 0 if report(records) else 1


if __name__ == "__main__":
    sys.exit(main())
