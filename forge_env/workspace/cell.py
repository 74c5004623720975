"""The code a workspace's sandbox session runs: the first cell defines these helpers, later cells call them.

``_setup`` unpacks the checkout into ``repo/`` (the shell's working directory) with a home directory whose
``python``/``python3``/``pytest`` are the sandbox's interpreter; ``_bash``, ``_view``, ``_edit``, ``_create``
are the agent's tools, ``_snapshot`` what grading reads. A workspace of another shape appends to ``CELL``
(Terminal-v0 redefines the root, the environment and the start).

Kept as source text (``CELL``): it runs inside the sandbox, never on the host. Every call reads its
arguments as JSON from stdin and prints one JSON line (``{"ok": ...}`` or ``{"error": ...}``) last.
"""

CELL = r'''
import base64, hashlib, io, json, os, selectors, signal, stat, subprocess, sys, tarfile, time
_ROOT = os.path.join(os.getcwd(), "repo")
_HOME = os.path.join(os.getcwd(), "home")
_BIN = os.path.join(_HOME, "bin")  # python, python3 and pytest: the sandbox's interpreter, whatever its name
_ENV = {"PATH": _BIN + ":" + os.path.dirname(sys.executable) + ":/usr/local/bin:/usr/bin:/bin", "HOME": _HOME, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
        "TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat", "GIT_CONFIG_NOSYSTEM": "1",
        "PYTHONDONTWRITEBYTECODE": "1", "USER": "agent"}

def _reply(value):
    sys.stdout.write("\n" + json.dumps(value) + "\n")

def _args():
    return json.loads(sys.stdin.read() or "{}")

def _path(path):
    full = os.path.normpath(os.path.join(_ROOT, path))
    return full

def _lean_python():
    """When the sandbox's interpreter is a virtualenv: make the home directory a virtualenv over the same
    base interpreter whose one .pth file lists the interpreter's package directories. The packages are the
    same; their .pth *import hooks* (an editable install's finder, setuptools' distutils shim) are not run,
    which is most of a bare `python`'s start-up in a development virtualenv (docs/swe.md)."""
    import site
    base = os.path.realpath(getattr(sys, "_base_executable", "") or "")
    sites = set(site.getsitepackages())
    if sys.prefix == sys.base_prefix or not os.path.isfile(base) or not sites & set(sys.path):
        return None
    start = min(i for i, p in enumerate(sys.path) if p in sites)
    paths = [p for p in sys.path[start:] if p and os.path.isdir(p) and not os.access(p, os.W_OK)]
    version = "%d.%d" % sys.version_info[:2]
    packages = os.path.join(_HOME, "lib", "python" + version, "site-packages")
    os.makedirs(packages, exist_ok=True)
    with open(os.path.join(packages, "_forge_sandbox_packages.pth"), "w") as f:
        f.write("".join(p + "\n" for p in paths))
    with open(os.path.join(_HOME, "pyvenv.cfg"), "w") as f:
        f.write("home = %s\ninclude-system-site-packages = false\nversion = %d.%d.%d\n"
                % ((os.path.dirname(base),) + tuple(sys.version_info[:3])))
    return base

def _setup():
    import shutil
    _ENV.update({k: v for k, v in _args().get("env", {}).items() if k.startswith("PYTEST_")})
    if os.path.isdir(_ROOT):
        shutil.rmtree(_ROOT, ignore_errors=True)
    os.makedirs(_BIN, exist_ok=True)
    python = _lean_python() or sys.executable
    for name in ("python", "python3"):
        if not os.path.lexists(os.path.join(_BIN, name)):
            os.symlink(python, os.path.join(_BIN, name))
    with open(os.path.join(_BIN, "pytest"), "w") as f:
        f.write('#!/bin/sh\nexec "%s" -m pytest "$@"\n' % os.path.join(_BIN, "python"))
    os.chmod(os.path.join(_BIN, "pytest"), 0o755)
    # Where the scratch directory is mounted noexec (docker), bash skips that script and would find the
    # image's own pytest, whose sys.path lacks the repository: `pytest` is also a function of every bash.
    with open(os.path.join(_HOME, ".forge_bash_env"), "w") as f:
        f.write('pytest() { "%s" -m pytest "$@"; }\n' % os.path.join(_BIN, "python"))
    _ENV["BASH_ENV"] = os.path.join(_HOME, ".forge_bash_env")
    done = subprocess.run(["tar", "-xzf", "_base.tar.gz", "-C", os.getcwd()], capture_output=True)
    if done.returncode != 0:  # no tar/gzip in the image: the slower way
        with tarfile.open("_base.tar.gz") as tar:
            try:
                tar.extractall(os.getcwd(), filter="tar")
            except TypeError:  # Python before 3.11.4 (Debian bookworm's): a trusted tar, built on the host
                tar.extractall(os.getcwd())
    os.unlink("_base.tar.gz")
    with open(os.path.join(_HOME, ".gitconfig"), "w") as f:
        f.write("[user]\n\tname = agent\n\temail = agent@localhost\n[safe]\n\tdirectory = *\n")
    _reply({"ok": _ROOT})

def _clip(data, cap):
    if len(data) <= cap:
        return data.decode("utf-8", "replace")
    half = cap // 2
    return (data[:half].decode("utf-8", "replace") + f"\n[... {len(data) - cap} bytes cut ...]\n"
            + data[-half:].decode("utf-8", "replace"))

def _bash():
    a = _args()
    os.makedirs(_ROOT, exist_ok=True)
    proc = subprocess.Popen(["/bin/bash", "-c", a["command"]], cwd=_ROOT, env=_ENV, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    head, tail, total, cap = bytearray(), bytearray(), 0, a["cap"]
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + a["timeout"]
    timed_out, eof = False, False

    def take():
        nonlocal total, tail, eof
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                eof = True
                return
            total += len(chunk)
            room = cap - len(head)
            head.extend(chunk[:max(room, 0)])
            tail = (tail + chunk[max(room, 0):])[-cap:]

    while proc.poll() is None:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        if not eof and sel.select(min(left, 0.05)):
            take()
        elif eof:
            time.sleep(min(left, 0.005))
    if timed_out:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
    end = time.monotonic() + 0.05  # what the command printed last (not what background processes print on)
    while not eof and time.monotonic() < end and sel.select(0.01):
        take()
    sel.close()
    proc.stdout.close()
    out = bytes(head) + (bytes(tail) if total <= 2 * cap else b"")
    text = _clip(out, 2 * cap) if total <= 2 * cap else (
        bytes(head).decode("utf-8", "replace") + f"\n[... {total - 2 * cap} bytes cut ...]\n" + bytes(tail).decode("utf-8", "replace"))
    _reply({"ok": {"output": text, "exit_code": proc.returncode, "timed_out": timed_out}})

def _view():
    a = _args()
    full = _path(a["path"])
    if os.path.isdir(full):
        entries = []
        for name in sorted(os.listdir(full)):
            if name == ".git":
                continue
            entries.append(name + ("/" if os.path.isdir(os.path.join(full, name)) else ""))
        return _reply({"ok": "\n".join(entries) or "(empty directory)"})
    if not os.path.isfile(full):
        return _reply({"error": f"view: {a['path']} does not exist"})
    data = open(full, "rb").read(a["cap"] * 4)
    if b"\0" in data[:8192]:
        return _reply({"error": f"view: {a['path']} is a binary file"})
    lines = data.decode("utf-8", "replace").splitlines()
    start = max(int(a.get("start_line") or 1), 1)
    end = int(a.get("end_line") or len(lines))
    if end < 0:
        end = len(lines)
    if start > max(len(lines), 1):
        return _reply({"error": f"view: start_line {start} is past the end ({len(lines)} lines)"})
    body = "\n".join(f"{n:6d}\t{lines[n - 1]}" for n in range(start, min(end, len(lines)) + 1))
    _reply({"ok": _clip(body.encode(), a["cap"])})

def _edit():
    a = _args()
    full = _path(a["path"])
    if not os.path.isfile(full):
        return _reply({"error": f"edit: {a['path']} does not exist (use create to make a new file)"})
    text = open(full, encoding="utf-8", errors="surrogateescape").read()
    old, new = a["old_str"], a["new_str"]
    if not old:
        return _reply({"error": "edit: old_str is empty"})
    count = text.count(old)
    if count != 1:
        where = "" if count == 0 else " (lines " + ", ".join(
            str(text[:i].count("\n") + 1) for i in _find_all(text, old)[:10]) + ")"
        return _reply({"error": f"edit: old_str occurs {count} times in {a['path']}{where}; it must occur "
                                f"exactly once (include more surrounding lines)"})
    at = text.index(old)
    text = text.replace(old, new, 1)
    with open(full, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
    first = text[:at].count("\n") + 1
    lines = text.splitlines()
    lo, hi = max(first - 3, 1), min(first + new.count("\n") + 3, len(lines))
    snippet = "\n".join(f"{n:6d}\t{lines[n - 1]}" for n in range(lo, hi + 1))
    _reply({"ok": f"edited {a['path']}; lines {lo}-{hi} now read:\n{snippet}"})

def _find_all(text, old):
    found, i = [], text.find(old)
    while i >= 0:
        found.append(i)
        i = text.find(old, i + 1)
    return found

def _create():
    a = _args()
    full = _path(a["path"])
    if os.path.isdir(full):
        return _reply({"error": f"create: {a['path']} is a directory"})
    existed = os.path.exists(full)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(a["content"])
    _reply({"ok": f"{'overwrote' if existed else 'created'} {a['path']} ({a['content'].count(chr(10)) + 1} lines)"})

def _snapshot():
    a = _args()
    manifest, cap = a["manifest"], a["cap"]
    changed, odd, too_big, seen, total = {}, [], [], set(), 0
    for directory, dirs, names in os.walk(_ROOT):
        if directory == _ROOT and ".git" in dirs:
            dirs.remove(".git")
        for name in names + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            full = os.path.join(directory, name)
            rel = os.path.relpath(full, _ROOT)
            seen.add(rel)
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                if manifest.get(rel) != "link:" + os.readlink(full):
                    odd.append(rel)
                continue
            if not stat.S_ISREG(info.st_mode):
                odd.append(rel)
                continue
            digest = hashlib.sha256()
            with open(full, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            if manifest.get(rel) == digest.hexdigest():
                continue
            if info.st_size > cap - total:
                too_big.append(rel)
                continue
            data = open(full, "rb").read(cap - total + 1)
            total += len(data)
            changed[rel] = base64.b64encode(data).decode()
    deleted = sorted(p for p in manifest if p not in seen)
    _reply({"ok": {"changed": changed, "deleted": deleted, "odd": sorted(odd), "too_big": sorted(too_big)}})
'''
