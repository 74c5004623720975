"""The grading run's code (source text: it runs inside the sandbox), its prelude and pytest's report plugin.

A grading run is forked from a worker's zygote that already ran :data:`PRELUDE` (trusted, once per
worker): ``pytest``, its built-in plugins and the standard-library modules plugins use are imported
there, so a run pays for collecting and running the tests, not for starting pytest (the "pre-forked
grader"). The prelude imports only from ``sys.path`` directories the sandbox cannot write (never from the
run directory).

:data:`RUNNER`'s stdin: one JSON line (test ids, timeout) then a tar of the tree. The runner unpacks it,
makes itself the child subreaper and forks the pytest process: ``pytest.main`` with the interpreter's
``-I`` flags (the zygote's), the run directory taken off ``sys.path`` and the repository *appended* to it
(a ``pytest.py`` or ``_pytest/`` the agent adds cannot replace the test runner, which is already
imported anyway), a clean environment and the repository as its working directory. When pytest ends (or
its deadline passes) the runner kills every process left below it (nothing can write after the report is
read), then prints one JSON line: each test id's status from the plugin's report file. The report's
path reaches the plugin as an attribute of its module object, never through the environment, and its
name is random per run (the code under test cannot find it by name; see ``canary.py`` for what else
guards the report).

Installed plugins (``pytest11`` entry points) load only when asked: the spec's ``"plugins"`` names them
(``-p NAME``), ``"autoload": true`` loads every one as a bare ``pytest`` would. By default
``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` is set: each plugin would be imported, its package assertion-rewritten
from source, on every run (~220 ms for this virtualenv's five, none of which a graded repository asked
for). Plugins asked for are imported in the run, after the rewriting hook, as a plain ``pytest`` run does.
"""

#: The arguments of every graded (and synthesis) pytest run, before the plugins asked for and the test ids
#: (the report plugin is passed as an object: ``-p NAME`` would scan every installed distribution).
PYTEST_ARGS = ("-p", "no:cacheprovider", "-q", "-rN")

PLUGIN = r'''
import json, os
_report_path = None  # set on the module object by whoever runs pytest (never an environment variable)
_statuses = {}
_messages = {}
_marked = set()  # tests whose own xfail marker is on their function or class (see _own_xfail)

def _set(nodeid, status):
    if _statuses.get(nodeid) not in ("failed", "error"):
        _statuses[nodeid] = status

def _own_xfail(item):
    """An xfail marker on the test function (decorator, pytest.param) or its class. Not one on the module
    or a package: code under test, imported by the test module, can set the importing module's
    ``pytestmark`` before the test functions are even defined. Nor an imperative pytest.xfail()."""
    import pytest
    return any(node is item or isinstance(node, pytest.Class) for node, _ in item.iter_markers_with_node("xfail"))

def pytest_runtest_makereport(item, call):
    if _own_xfail(item):
        _marked.add(item.nodeid)

def _xfail(report):
    return "xfail" if report.nodeid in _marked else "xfail-imperative"

def pytest_runtest_logreport(report):
    xfail = hasattr(report, "wasxfail")
    if report.failed:
        _set(report.nodeid, "failed" if report.when == "call" else "error")
        _messages.setdefault(report.nodeid, str(report.longreprtext)[-4000:])
    elif report.when == "call":
        _set(report.nodeid, (_xfail(report) if xfail else "skipped") if report.skipped else ("xpass" if xfail else "passed"))
    elif report.skipped:
        _set(report.nodeid, _xfail(report) if xfail else "skipped")

def pytest_sessionfinish(session, exitstatus):
    with open(_report_path, "w") as f:
        json.dump({"statuses": _statuses, "messages": _messages}, f)
'''

PRELUDE = r'''
import ctypes, io, json, os, secrets, select, signal, subprocess, sys, tarfile, time

def _forge_preload():
    import importlib
    saved = list(sys.path)
    # Only from directories sandboxed code cannot write (the run directory, first on sys.path, is left out).
    sys.path[:] = [p for p in saved if p and not os.access(p, os.W_OK)]
    try:
        # Standard-library modules that installed pytest plugins import (never marked for assertion
        # rewriting: only the plugins' own distributions are).
        for name in ("asyncio", "unittest", "unittest.mock", "difflib", "pkgutil", "queue", "argparse",
                     "inspect", "dataclasses", "importlib.metadata", "tempfile", "shlex", "fnmatch", "glob"):
            try:
                importlib.import_module(name)
            except Exception:
                pass
        try:
            import pytest, _pytest.config
        except Exception:
            return None
        for name in getattr(_pytest.config, "default_plugins", ()):
            try:
                importlib.import_module("_pytest." + name)
            except Exception:
                pass
        return pytest
    finally:
        sys.path[:] = saved

_forge_pytest = _forge_preload()


def _forge_report_plugin(path):
    """The report plugin as a module object (never a file a repository's module could shadow), writing
    its report to ``path``."""
    import types
    module = types.ModuleType("forge_swe_report")
    exec(compile(PLUGIN, "forge_swe_report", "exec"), module.__dict__)
    module._report_path = path
    return module
'''.replace("(PLUGIN,", "(" + repr(PLUGIN) + ",")

RUNNER = r'''
data = sys.stdin.buffer.read()
header, _, payload = data.partition(b"\n")
del data
spec = json.loads(header)
base = os.getcwd()
try:  # GNU tar (in C) unpacks a 1,000-file tree several times faster than tarfile
    unpacked = subprocess.run(["tar", "-xf", "-", "-C", base], input=payload, capture_output=True).returncode == 0
except OSError:
    unpacked = False
if not unpacked:
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        try:
            tar.extractall(base, filter="data")
        except TypeError:  # Python before 3.11.4: the host built this tar from checked relative paths
            tar.extractall(base)
del payload
root = os.path.join(base, "repo")
report = os.path.join(base, "forge_report_" + secrets.token_hex(16) + ".json")  # not guessable from the cwd
out_path = os.path.join(base, "forge_out.txt")
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": base, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
       "PYTHONDONTWRITEBYTECODE": "1"}
if not spec.get("autoload"):
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
chosen = [arg for name in spec.get("plugins", ()) for arg in ("-p", name)]
out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
sys.stdout.flush()
sys.stderr.flush()
pid = os.fork()
if pid == 0:  # the pytest process
    code = 3
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(root)
        sys.path[:] = [p for p in sys.path if p and p != base and os.path.abspath(p) != base] + [root]
        sys.argv = ["pytest"]
        plugin = _forge_report_plugin(report)
        report = out_path = None  # (this process's copies only: the runner reads the report after it)
        if _forge_pytest is None:
            sys.stderr.write("pytest is not installed in the sandbox's interpreter\n")
        else:
            code = int(_forge_pytest.main([*PYTEST_ARGS, *chosen, *spec["tests"]], plugins=[plugin]))
    except BaseException:
        import traceback
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if 0 <= code < 256 else 1)
os.close(out)

def _wait(pid, seconds):
    deadline = time.monotonic() + seconds
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if pidfd is not None:
                select.select([pidfd], [], [], remaining)
            else:
                time.sleep(min(remaining, 0.005))
    finally:
        if pidfd is not None:
            os.close(pidfd)

_wait(pid, spec["timeout"])

def _children():
    found = []
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                found.append(int(pid))
    return found

for _ in range(100):
    left = _children()
    if not left:
        break
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in left:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
statuses = {}
try:
    with open(report) as f:
        found = json.load(f)["statuses"]
    statuses = {t: found.get(t, "missing") for t in spec["tests"]}
except (OSError, ValueError):
    statuses = {t: "missing" for t in spec["tests"]}
with open(out_path, "rb") as f:
    f.seek(max(os.path.getsize(out_path) - 3000, 0))
    tail = f.read().decode("utf-8", "replace")
sys.stdout.write("\n" + json.dumps({"statuses": statuses, "tail": tail}) + "\n")
'''.replace("*PYTEST_ARGS,", repr(PYTEST_ARGS)[1:-1] + ",")
