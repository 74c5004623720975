"""The grading run's code (source text: it runs inside the sandbox) and pytest's report plugin.

stdin: one JSON line (test ids, timeout) then a tar of the tree. The runner unpacks it, runs
``python -I -m pytest`` semantics through ``pytest.main`` in a child process with the repository
*appended* to ``sys.path`` (``-I``: the working directory is not put first, so a ``pytest.py`` or
``_pytest/`` the agent adds cannot replace the test runner), makes itself the child subreaper and, when
pytest ends, kills every process left below it (nothing can write after the report is read), then prints
one JSON line: each test id's status from the plugin's report.
"""

PLUGIN = r'''
import json, os
_statuses = {}
_messages = {}

def _set(nodeid, status):
    if _statuses.get(nodeid) not in ("failed", "error"):
        _statuses[nodeid] = status

def pytest_runtest_logreport(report):
    xfail = hasattr(report, "wasxfail")
    if report.failed:
        _set(report.nodeid, "failed" if report.when == "call" else "error")
        _messages.setdefault(report.nodeid, str(report.longreprtext)[-4000:])
    elif report.when == "call":
        _set(report.nodeid, ("xfail" if xfail else "skipped") if report.skipped else ("xpass" if xfail else "passed"))
    elif report.skipped:
        _set(report.nodeid, "xfail" if xfail else "skipped")

def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["FORGE_SWE_REPORT"], "w") as f:
        json.dump({"statuses": _statuses, "messages": _messages}, f)
'''

RUNNER = r'''
import ctypes, io, json, os, signal, subprocess, sys, tarfile, time
data = sys.stdin.buffer.read()
header, _, payload = data.partition(b"\n")
spec = json.loads(header)
base = os.getcwd()
with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
    try:
        tar.extractall(base, filter="data")
    except TypeError:  # Python before 3.11.4: the host built this tar from checked relative paths
        tar.extractall(base)
root = os.path.join(base, "repo")
plugins = os.path.join(base, "forge_plugins")
os.makedirs(plugins)
with open(os.path.join(plugins, "forge_swe_report.py"), "w") as f:
    f.write(PLUGIN)
report = os.path.join(base, "forge_report.json")
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
boot = ("import sys; sys.path.append(%r); sys.path.append(%r); import pytest; "
        "sys.exit(pytest.main(['-p', 'forge_swe_report', '-p', 'no:cacheprovider', '-q', '-rN', *sys.argv[1:]]))"
        % (plugins, root))
env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": base, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
       "FORGE_SWE_REPORT": report, "PYTHONDONTWRITEBYTECODE": "1"}
out = open(os.path.join(base, "forge_out.txt"), "wb")
proc = subprocess.Popen([sys.executable, "-I", "-B", "-c", boot, *spec["tests"]], cwd=root, env=env,
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
try:
    proc.wait(timeout=spec["timeout"])
except subprocess.TimeoutExpired:
    pass

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
out.close()
with open(os.path.join(base, "forge_out.txt"), "rb") as f:
    f.seek(max(os.path.getsize(f.name) - 3000, 0))
    tail = f.read().decode("utf-8", "replace")
sys.stdout.write("\n" + json.dumps({"statuses": statuses, "tail": tail}) + "\n")
'''.replace("PLUGIN)", repr(PLUGIN) + ")")
