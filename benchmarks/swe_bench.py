"""SWE-v0's sandbox costs on both backends, against a naive baseline measured in the same run.

A generated repository of ``--files`` Python files (default 1,000) with a bug and a test suite. Measured:

- *set-up*: an episode's workspace from start to ready (a sandbox session, the cached base checkout
  unpacked, a fresh one-commit ``.git``); baseline: ``git clone`` of the mirror plus ``git checkout``;
- *bash step*: ``true``, ``ls``, ``python -c pass`` through the ``bash`` tool; baseline: a ``subprocess``
  per command on the host (process backend) or ``docker run --rm`` with the clone mounted (docker);
- *grading*: snapshot, test-infrastructure filter, a fresh run with ``test_patch`` and pytest's report;
- *episodes/s*: ``--episodes`` episodes of ``--actions`` bash actions and a grade, ``--concurrency`` at
  once; and the sandbox time of one 50-action trajectory (published reference: ~12.9 s on a hosted
  sandbox service, ~20 s on Kubernetes).

    python -m benchmarks.swe_bench [--backends process,docker] [--files 1000] [--repeats 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from environments.swe.env import SANDBOX_DEFAULTS, swe_image
from environments.swe.grading import grade
from environments.swe.repos import base_checkout, git
from environments.swe.tasks import parse_task
from forge_env.sandbox import make_sandbox
from forge_env.workspace import Workspace, close_spares

MODULE = "def value_{n}(x):\n    return x + {n}\n"


def build_repo(root: Path, files: int) -> dict:
    """A repository of ``files`` small modules; ``pkg/core.py`` has a bug that ``tests/test_core.py`` finds."""
    repo = root / "bench__repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    for n in range(files - 4):
        sub = repo / "pkg" / f"m{n // 100}"
        sub.mkdir(exist_ok=True)
        (sub / f"mod_{n}.py").write_text(MODULE.format(n=n))
    (repo / "pkg" / "core.py").write_text("def double(x):\n    return x * 3\n")
    (repo / "tests" / "test_basic.py").write_text("def test_ok():\n    assert 1 + 1 == 2\n")
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "base", cwd=repo)
    base = git("rev-parse", "HEAD", cwd=repo).stdout.decode().strip()
    (repo / "tests" / "test_core.py").write_text("from pkg.core import double\n\n\ndef test_double():\n"
                                                 "    assert double(2) == 4\n")
    git("add", "-N", "tests/test_core.py", cwd=repo)
    test_patch = git("diff", cwd=repo).stdout.decode()
    (repo / "pkg" / "core.py").write_text("def double(x):\n    return x * 2\n")
    patch = git("diff", "--", "pkg", cwd=repo).stdout.decode()
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "fix", cwd=repo)
    return {"instance_id": "bench-1", "repo": "bench/repo", "base_commit": base, "problem_statement": "double is wrong",
            "patch": patch, "test_patch": test_patch, "FAIL_TO_PASS": ["tests/test_core.py::test_double"],
            "PASS_TO_PASS": ["tests/test_basic.py::test_ok"]}


class CpuMeter:
    """CPU-seconds used by this process and everything it starts (sandbox workers included): a cgroup-v1
    ``cpuacct`` group of its own, where one can be made (root); figures that load on the machine does not
    inflate the way it inflates wall time. ``seconds()`` is None where no group could be made."""

    def __init__(self) -> None:
        self.path: str | None = None

    def start(self) -> None:
        try:
            with open("/proc/self/cgroup") as f:
                mine = next(line.split(":", 2)[2].strip() for line in f
                            if "cpuacct" in line.split(":", 2)[1].split(","))
            self.parent = "/sys/fs/cgroup/cpuacct" + mine.rstrip("/")
            path = f"{self.parent}/forge-swe-bench-{os.getpid()}"
            os.mkdir(path)
            with open(f"{path}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            self.path = path
        except (OSError, StopIteration):
            pass

    def seconds(self) -> float | None:
        if self.path is None:
            return None
        with open(f"{self.path}/cpuacct.usage") as f:
            return int(f.read()) / 1e9

    def close(self) -> None:
        if self.path is not None:
            with open(f"{self.parent}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            try:
                os.rmdir(self.path)
            except OSError:
                pass  # a process it started still runs; the group goes when that one is gone and it is removed
            self.path = None


CPU = CpuMeter()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def show(label: str, values: list[float]) -> None:
    print(f"  {label:34s} p50 {1000 * statistics.median(values):8.1f} ms   p99 {1000 * pct(values, 0.99):8.1f} ms"
          f"   (n={len(values)})")


async def measure_backend(backend: str, task, root: Path, args: argparse.Namespace) -> None:
    options = SANDBOX_DEFAULTS | ({"image": swe_image()} if backend == "docker" else {})
    sandbox = make_sandbox(backend, max_concurrency=args.concurrency, **options)
    checkout = base_checkout(task, root)
    try:
        print(f"{backend} backend")
        warm = Workspace(sandbox, checkout)
        await warm.start()
        await warm.close()
        for spares, label in ((0, "set-up, cold (workspace ready)"), (2, "set-up, spare sessions")):
            setups = []
            for _ in range(args.repeats):
                workspace = Workspace(sandbox, checkout, spares=spares)
                if spares:
                    await asyncio.sleep(args.gap)  # the spare taken last time is replaced meanwhile
                started = time.perf_counter()
                await workspace.start()
                setups.append(time.perf_counter() - started)
                await workspace.close()
            show(label, setups)
        workspace = Workspace(sandbox, checkout)
        await workspace.start()
        for command in ("true", "ls", "python -c pass"):
            times = []
            for _ in range(args.repeats * 2):
                started = time.perf_counter()
                await workspace.bash(command, 30)
                times.append(time.perf_counter() - started)
            show(f"bash `{command}`", times)
        gradings = []
        for _ in range(max(args.repeats // 3, 2) + args.concurrency):
            snapshot = await workspace.snapshot()
            started = time.perf_counter()
            await grade(sandbox, task, checkout, snapshot, timeout=120)
            gradings.append(time.perf_counter() - started)
        # The first grade on each pool worker also builds the grader's prelude (pytest imported once per worker).
        show("grading, first on each worker", gradings[:args.concurrency])
        show("grading", gradings[args.concurrency:])
        await workspace.close()

        async def episode(actions: int) -> tuple[float, float, float, float, float]:
            """(total, set-up, actions, grade) seconds of one episode, and the CPU-seconds it used (NaN
            where they cannot be measured)."""
            cpu = CPU.seconds()
            started = time.perf_counter()
            ws = Workspace(sandbox, checkout, spares=2)
            await ws.start()
            ready = time.perf_counter()
            commands = ["ls", "cat pkg/core.py", "grep -rn double pkg | head", "python -c pass", "git status --short"]
            for n in range(actions - 1):
                await ws.bash(commands[n % len(commands)], 30)
            await ws.edit("pkg/core.py", "x * 3", "x * 2")
            acted = time.perf_counter()
            result = await grade(sandbox, task, checkout, await ws.snapshot(), timeout=120)
            await ws.close()
            assert result.resolved, result.statuses
            done = time.perf_counter()
            used = CPU.seconds()
            return (done - started, ready - started, acted - ready, done - acted,
                    float("nan") if cpu is None or used is None else used - cpu)

        trajectories = []
        for _ in range(args.trajectories):
            await asyncio.sleep(args.gap)  # a spare session is ready, as between episodes
            trajectories.append(await episode(50))
        total, setup, acting, grading, cpu = (statistics.median(t[i] for t in trajectories) for i in range(5))
        print(f"  one 50-action trajectory + grade     {total:8.2f} s  p50 of {len(trajectories)} (set-up {setup:.2f}, "
              f"actions {acting:.2f}, snapshot + grade + close {grading:.2f}; CPU-seconds "
              f"{'of every process' if backend == 'process' else 'on the host (not the containers)'} "
              f"{cpu:.2f}); hosted service ~12.9 s, k8s ~20 s")
        started = time.perf_counter()
        await asyncio.gather(*(episode(args.actions) for _ in range(args.episodes)))
        elapsed = time.perf_counter() - started
        print(f"  {args.episodes} episodes of {args.actions} actions, {args.concurrency} at once: "
              f"{args.episodes / elapsed:.2f} episodes/s")
    finally:
        close_spares(sandbox)
        await sandbox.close()


def naive_baseline(backend: str, root: Path, task, args: argparse.Namespace) -> None:
    print(f"naive baseline ({'git clone + subprocess' if backend == 'process' else 'git clone + docker run'})")
    mirror = root / "bench__repo"
    setups, clones = [], []
    for n in range(args.repeats):
        target = root / f"clone{n}"
        started = time.perf_counter()
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(mirror), str(target)], check=True)
        subprocess.run(["git", "checkout", "-q", task.base_commit], cwd=target, check=True)
        setups.append(time.perf_counter() - started)
        clones.append(target)
    show("set-up (clone + checkout)", setups)
    for command in ("true", "ls", "python3 -c pass"):
        times = []
        for _ in range(args.repeats if backend == "docker" else args.repeats * 2):
            started = time.perf_counter()
            if backend == "process":
                subprocess.run(["bash", "-c", command], cwd=clones[0], capture_output=True)
            else:
                subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{clones[0]}:/w", "-w", "/w",
                                swe_image(), "bash", "-c", command], capture_output=True)
            times.append(time.perf_counter() - started)
        show(f"`{command}`", times)
    for target in clones:
        shutil.rmtree(target, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="process,docker")
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--actions", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--gap", type=float, default=1.0, help="seconds between warm set-ups (episode length)")
    parser.add_argument("--trajectories", type=int, default=3, help="50-action trajectories timed")
    args = parser.parse_args()
    one, five, fifteen = os.getloadavg()
    print(f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs")
    CPU.start()
    try:
        run(args)
    finally:
        CPU.close()


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="forge-swe-bench-") as tmp:
        root = Path(tmp)
        task = parse_task(build_repo(root, args.files))
        started = time.perf_counter()
        base_checkout(task, root)
        print(f"{args.files}-file repository; base checkout built once per task in "
              f"{time.perf_counter() - started:.2f} s (cached)")
        for backend in args.backends.split(","):
            asyncio.run(measure_backend(backend, task, root, args))
            naive_baseline(backend, root, task, args)


if __name__ == "__main__":
    main()
