"""Fork server that runs inside a sandbox: a bubblewrap namespace, a container, or (degraded) the bare host.

The host starts one server per worker and talks to it over fd 0 (requests) and fd 1 (responses), each
message a 4-byte big-endian length followed by a JSON object. The server imports a few common modules
once, then serves requests:

- ``run``: fork a pristine copy of the server into a fresh working directory, apply the rlimits, run the
  code as ``__main__``, capture stdout/stderr (capped) until the program exits or its deadline passes,
  then kill every process the run left behind and wipe everything it wrote. Every run starts from the
  same untouched interpreter, so nothing leaks from one run into the next.
  A request may carry a ``prelude``: trusted setup code the server runs once (per distinct text) so
  that children start with its definitions already built.
- ``exec`` (session workers): run a cell in a long-lived REPL child that keeps its globals between
  calls; it is restarted (state lost) when a cell times out, floods output or kills the interpreter.

This file is executed as a script (``python -c``) inside the sandbox, so it uses the standard library
only and imports nothing from forge_env. When it runs as PID 1 of its own PID namespace, code inside
cannot signal it (the kernel shields a namespace's init) and ``kill(-1)`` reaches every process of the
run; elsewhere it is a child subreaper and walks /proc to find what the run left behind.
"""

import base64
import ctypes
import json
import os
import resource
import select
import shutil
import signal
import struct
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
IPC_RMID = 0
SETUP_FAILED_EXIT = 125
KILL_GRACE_S = 2.0

_libc = ctypes.CDLL(None, use_errno=True)
CONFIG: dict = {}


# --- framing -----------------------------------------------------------------------------------------


def read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    header = read_exact(fd, 4)
    if header is None:
        return None
    body = read_exact(fd, struct.unpack(">I", header)[0])
    return None if body is None else json.loads(body)


def write_frame(fd, obj):
    data = json.dumps(obj).encode()
    data = struct.pack(">I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def b64(data):
    return base64.b64encode(bytes(data)).decode("ascii")


# --- process control ---------------------------------------------------------------------------------


def prctl(option, value):
    _libc.prctl(option, value, 0, 0, 0)


def drop_privileges(ids):
    if ids:
        uid, gid = ids
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)


def descendants(root):
    """Pids of every live descendant of ``root`` (from /proc; used when we are not a namespace's init)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, stack = [], [root]
    while stack:
        for pid in children.get(stack.pop(), ()):
            found.append(pid)
            stack.append(pid)
    return found


def reap(statuses):
    """Collect every exited child without blocking, recording (status, rusage) by pid."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = (status, usage)


def kill_all(statuses):
    """SIGKILL every process of the current run (all but us) and reap them, until none is left."""
    me = os.getpid()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if me == 1:
            try:
                os.kill(-1, signal.SIGKILL)
                alive = True
            except ProcessLookupError:
                alive = False
        else:
            pids = descendants(me)
            alive = bool(pids)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        reap(statuses)
        if not alive:
            return
        time.sleep(0.0005)


def remove_sysv_ipc():
    """Delete SysV shared memory, semaphores and queues a run created (they outlive processes)."""
    for kind in ("shm", "sem", "msg"):
        try:
            fd = os.open(f"/proc/sysvipc/{kind}", os.O_RDONLY)
        except OSError:
            continue
        try:
            data = os.read(fd, 1 << 20)
        finally:
            os.close(fd)
        for line in data.splitlines()[1:]:  # usually none: the header line only
            ident = int(line.split()[1])
            if kind == "shm":
                _libc.shmctl(ident, IPC_RMID, None)
            elif kind == "sem":
                _libc.semctl(ident, 0, IPC_RMID)
            else:
                _libc.msgctl(ident, IPC_RMID, None)


def _force_remove(func, path, _exc):
    try:
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
    except OSError:
        pass
    try:
        func(path)
    except OSError:
        pass


def wipe(directory, keep=()):
    """Empty ``directory`` (everything a run wrote), even entries it made read-only, except the ``keep``
    paths (read-only binds such as an interpreter under /tmp) and the directories leading to them."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if entry.path in keep:
            continue
        if any(k.startswith(entry.path + "/") for k in keep):
            wipe(entry.path, keep)
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                try:
                    os.rmdir(entry.path)  # the common case, an empty directory: no tree walk
                    continue
                except OSError:
                    pass
                os.chmod(entry.path, 0o700)
                shutil.rmtree(entry.path, onerror=_force_remove)
            else:
                os.unlink(entry.path)
        except OSError:
            pass


def clean_after_run():
    for directory in CONFIG["scratch"]:
        wipe(directory, CONFIG["keep"])
    if CONFIG["pid1"]:
        remove_sysv_ipc()


# --- the child: limits, fresh runtime, running code as __main__ ---------------------------------------


def apply_limits(limits, cpu_soft=None):
    mb = 1024 * 1024
    cpu = int(limits["cpu_seconds"] + 0.999)
    settings = [
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_FSIZE, limits["file_size_mb"] * mb, limits["file_size_mb"] * mb),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
        # The server itself is one process of this uid in the namespace, hence the +1.
        (resource.RLIMIT_NPROC, limits["max_processes"] + 1, limits["max_processes"] + 1),
        (resource.RLIMIT_AS, limits["memory_mb"] * mb, limits["memory_mb"] * mb),
    ]
    if cpu_soft is None:
        settings.append((resource.RLIMIT_CPU, cpu, cpu + 1))
    else:  # sessions: a per-call budget on top of what the interpreter already used
        settings.append((resource.RLIMIT_CPU, cpu_soft, resource.RLIM_INFINITY))
    for which, soft, hard in settings:
        _, current_hard = resource.getrlimit(which)
        if current_hard != resource.RLIM_INFINITY:
            hard = current_hard if hard == resource.RLIM_INFINITY else min(hard, current_hard)
            soft = min(soft, hard)
        resource.setrlimit(which, (soft, hard))


def become_child(workdir, stdin_fd, out_w, err_w, keep_fds=()):
    """Turn a freshly forked server into a clean sandboxed process (stdio, cwd, limits).

    Every page the child touches costs a copy-on-write fault, so this does as little as it can: the
    server's own (never used) sys.std* objects are kept, as they already sit on fds 0-2.
    """
    if not CONFIG["pid1"]:
        os.setsid()  # a namespace's processes all die with it; on the bare host we need our own session
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.dup2(stdin_fd, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    keep = sorted(fd for fd in keep_fds if fd > 2)
    low = 3
    for fd in keep + [65536]:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.chdir(workdir)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    if "random" in sys.modules:  # preloaded: without a reseed every run would draw the same numbers
        sys.modules["random"].seed()


def print_exception(exc):
    import linecache
    import traceback

    for filename, code in SOURCES.items():  # registered only now: most runs never print a traceback
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next  # hide the server's own frames
    traceback.print_exception(type(exc), exc, tb)


def exit_status(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def finish_interpreter(status):
    """What the interpreter does at exit: join threads, run atexit handlers, flush."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None and threading.active_count() > 1:
            threading._shutdown()
        import atexit

        if atexit._ncallbacks():
            atexit._run_exitfuncs()
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException as exc:
        print_exception(exc)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return status


SOURCES = {}


def register_source(filename, code):
    """Remember a code string so tracebacks can show its lines."""
    SOURCES[filename] = code


PRELUDES = {}
MAX_PRELUDES = 16


def load_prelude(source):
    """The globals left by running ``source`` (trusted setup code) in the server, once per distinct text.

    Children fork with these already built, so per-run code can be a one-line call into them."""
    namespace = PRELUDES.get(source)
    if namespace is None:
        import builtins
        import gc

        if len(PRELUDES) >= MAX_PRELUDES:
            PRELUDES.pop(next(iter(PRELUDES)))
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        exec(compile(source, "<prelude>", "exec"), namespace)
        PRELUDES[source] = namespace
        gc.freeze()
    return namespace


def run_main(code, prelude=None):
    import types

    main = types.ModuleType("__main__")
    main.__file__ = "main.py"
    if prelude:
        main.__dict__.update((k, v) for k, v in prelude.items() if k not in ("__name__", "__builtins__"))
    sys.modules["__main__"] = main
    register_source("main.py", code)
    try:
        exec(compile(code, "main.py", "exec"), main.__dict__)
        status = 0
    except SystemExit as exc:
        status = exit_status(exc)
    except BaseException as exc:
        print_exception(exc)
        status = 1
    return finish_interpreter(status)


# --- the server side of a run --------------------------------------------------------------------------


def write_files(workdir, files):
    for name, content in (files or {}).items():
        path = os.path.normpath(os.path.join(workdir, name))
        if not path.startswith(workdir + "/"):
            raise ValueError(f"file name {name!r} leaves the working directory")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            data = base64.b64decode(content)
            while data:
                data = data[os.write(fd, data):]
        finally:
            os.close(fd)


def stdin_fd_for(data, scratch):
    """An fd to read ``data`` from (an unlinked file, so no pipe can deadlock), or /dev/null."""
    if data is None:
        return os.open(os.devnull, os.O_RDONLY)
    path = os.path.join(scratch, f".stdin-{os.getpid()}-{time.monotonic_ns()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(path)
    payload = base64.b64decode(data)
    while payload:
        payload = payload[os.write(fd, payload):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class Capture:
    """Reads a run's stdout/stderr pipes into capped buffers."""

    def __init__(self, out_r, err_r, cap):
        self.buffers = {out_r: bytearray(), err_r: bytearray()}
        self.out_r, self.err_r, self.cap = out_r, err_r, cap
        self.overflow = False
        for fd in self.buffers:
            os.set_blocking(fd, False)

    def read(self, fd):
        """Read what is there; return False at end of file."""
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return True
            if not data:
                return False
            buf = self.buffers[fd]
            room = self.cap - len(buf)
            if len(data) > room:
                buf += data[:max(room, 0)]
                self.overflow = True
                return True
            buf += data

    def drain(self, fds, until_eof, budget_s=KILL_GRACE_S):
        fds = list(fds)
        deadline = time.monotonic() + budget_s
        while fds:
            fds = [fd for fd in fds if self.read(fd)]
            if not until_eof or not fds or time.monotonic() > deadline:
                return
            select.select(fds, [], [], max(0.0, deadline - time.monotonic()))

    def result(self):
        return b64(self.buffers[self.out_r]), b64(self.buffers[self.err_r])


def watch(pid, capture, deadline, extra_fd=None):
    """Wait for ``pid`` to exit (or ``extra_fd`` to become readable) while capturing output.

    Returns ("exited", status, rusage) | ("extra", None, None) | ("timeout"|"output_limit", None, None).
    """
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    open_fds = [capture.out_r, capture.err_r]
    try:
        while True:
            if capture.overflow:
                return "output_limit", None, None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout", None, None
            watched = open_fds + [fd for fd in (pidfd, extra_fd) if fd is not None]
            ready, _, _ = select.select(watched, [], [], remaining if pidfd is not None else min(remaining, 0.005))
            for fd in ready:
                if fd in open_fds and not capture.read(fd):
                    open_fds.remove(fd)
            if extra_fd is not None and extra_fd in ready:
                return "extra", None, None
            done, status, usage = os.wait4(pid, os.WNOHANG)
            if done:
                return "exited", status, usage
    finally:
        if pidfd is not None:
            os.close(pidfd)


def classify(status, usage, stderr_tail, limits, reason):
    """(exit_code, killed_reason) from a wait status and what the supervisor saw."""
    exit_code = None if status is None else os.waitstatus_to_exitcode(status)
    if reason:
        return exit_code, reason
    if exit_code is not None and exit_code < 0:
        sig = -exit_code
        cpu = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= limits["cpu_seconds"] - 0.05):
            return exit_code, "cpu"
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return exit_code, f"signal:{name}"
    if exit_code and ran_out_of_memory(stderr_tail):
        return exit_code, "memory"
    return exit_code, None


def ran_out_of_memory(stderr_tail):
    """The program ended on an uncaught MemoryError (what hitting the address-space limit looks like)."""
    return stderr_tail.rstrip().rsplit(b"\n", 1)[-1].startswith(b"MemoryError")


def handle_run(req):
    limits = req["limits"]
    prelude = load_prelude(req["prelude"]) if req.get("prelude") else None
    scratch = CONFIG["scratch"][0]
    workdir = os.path.join(scratch, "run")
    os.mkdir(workdir, 0o700)
    try:
        write_files(workdir, req.get("files"))
        stdin_fd = stdin_fd_for(req.get("stdin"), scratch)
    except BaseException:
        clean_after_run()
        raise
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    started = time.monotonic()
    # The child inherits dumpability: made dumpable it may read its own /proc/self/fd and the like. No
    # other process exists in the namespace while the server is briefly dumpable, and the child waits
    # (on ``go``) until the server is not, so nothing can attach to the server meanwhile.
    go_r, go_w = os.pipe()
    prctl(PR_SET_DUMPABLE, 1)
    pid = os.fork()
    if pid != 0:
        prctl(PR_SET_DUMPABLE, 0)
        os.write(go_w, b"g")
        os.close(go_r)
        os.close(go_w)
    if pid == 0:
        try:
            os.read(go_r, 1)
            become_child(workdir, stdin_fd, out_w, err_w)
            apply_limits(limits)
        except BaseException as exc:
            os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
            os._exit(SETUP_FAILED_EXIT)
        os._exit(run_main(req["code"], prelude))
    for fd in (stdin_fd, out_w, err_w):
        os.close(fd)
    capture = Capture(out_r, err_r, limits["max_output_bytes"])
    statuses = {}
    try:
        outcome, status, usage = watch(pid, capture, started + req["timeout"])
        duration = time.monotonic() - started
        if outcome == "exited":
            capture.drain((out_r, err_r), until_eof=False)
        kill_all(statuses)
        if outcome != "exited":
            status, usage = statuses.get(pid, (None, None))
        capture.drain((out_r, err_r), until_eof=True)
    finally:
        os.close(out_r)
        os.close(err_r)
        clean_after_run()
    reason = None if outcome == "exited" else outcome
    if capture.overflow:
        reason = "output_limit"
    exit_code, reason = classify(status, usage, bytes(capture.buffers[err_r][-512:]), limits, reason)
    stdout, stderr = capture.result()
    return {"stdout": stdout, "stderr": stderr, "exit_code": exit_code, "timed_out": reason == "timeout",
            "killed_reason": reason, "duration_s": duration, "truncated": capture.overflow}


# --- sessions: a persistent REPL child ------------------------------------------------------------------


def run_cell(code, namespace, number):
    """Run one REPL cell; like the interactive interpreter, echo the value of a final expression."""
    import ast

    filename = f"<cell {number}>"
    register_source(filename, code)
    try:
        tree = ast.parse(code, filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), filename, "eval"), namespace)
            if value is not None:
                sys.displayhook(value)
        return 0
    except SystemExit as exc:
        return exit_status(exc)
    except BaseException as exc:
        print_exception(exc)
        return 1


def repl_main(cmd_r, res_w, limits):
    import types

    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    number = 0
    while True:
        req = read_frame(cmd_r)
        if req is None:
            os._exit(0)
        number += 1
        usage = resource.getrusage(resource.RUSAGE_SELF)
        apply_limits(limits, cpu_soft=int(usage.ru_utime + usage.ru_stime + limits["cpu_seconds"] + 0.999))
        fd = stdin_fd_for(req.get("stdin"), CONFIG["scratch"][0])
        os.dup2(fd, 0)
        os.close(fd)
        sys.stdin = sys.__stdin__ = type(sys.stdin)(open(0, "rb", closefd=False), encoding="utf-8",
                                                    errors="surrogateescape")
        status = run_cell(req["code"], main.__dict__, number)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        write_frame(res_w, {"exit_code": status})


class Repl:
    """The server's handle on the REPL child of a session worker."""

    def __init__(self, limits):
        scratch = CONFIG["scratch"][0]
        self.workdir = os.path.join(scratch, "session")
        os.makedirs(self.workdir, 0o700, exist_ok=True)
        cmd_r, self.cmd_w = os.pipe()
        self.res_r, res_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                become_child(self.workdir, devnull, out_w, err_w, keep_fds=(cmd_r, res_w))
                prctl(PR_SET_DUMPABLE, 1)  # (other processes of the session may be alive: not in the server)
                apply_limits(limits, cpu_soft=int(limits["cpu_seconds"] + 0.999))
            except BaseException as exc:
                os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
                os._exit(SETUP_FAILED_EXIT)
            repl_main(cmd_r, res_w, limits)
        for fd in (cmd_r, res_w, out_w, err_w, devnull):
            os.close(fd)
        self.capture = Capture(self.out_r, self.err_r, limits["max_output_bytes"])

    def close(self):
        kill_all({})
        for fd in (self.cmd_w, self.res_r, self.out_r, self.err_r):
            os.close(fd)


def handle_exec(req, state):
    limits = req["limits"]
    notes = []
    if state.get("repl") is None:
        state["repl"] = Repl(limits)
        if state.get("started"):
            notes.append("[sandbox] the session was restarted: earlier variables and files are gone")
        state["started"] = True
    repl = state["repl"]
    write_files(repl.workdir, req.get("files"))
    repl.capture.buffers = {repl.out_r: bytearray(), repl.err_r: bytearray()}
    repl.capture.overflow = False
    started = time.monotonic()
    write_frame(repl.cmd_w, {"code": req["code"], "stdin": req.get("stdin")})
    outcome, status, usage = watch(repl.pid, repl.capture, started + req["timeout"], extra_fd=repl.res_r)
    duration = time.monotonic() - started
    exit_code = reason = None
    if outcome == "extra":
        reply = read_frame(repl.res_r)
        if reply is not None:
            exit_code = reply["exit_code"]
            repl.capture.drain((repl.out_r, repl.err_r), until_eof=False)
            if exit_code and ran_out_of_memory(bytes(repl.capture.buffers[repl.err_r][-512:])):
                reason = "memory"
        else:  # the REPL died right after its cell
            outcome = "exited"
    if outcome == "exited" and status is None:
        _, status, usage = os.wait4(repl.pid, 0)
    if exit_code is None:
        reason = None if outcome == "exited" else outcome
        if outcome == "exited":
            repl.capture.drain((repl.out_r, repl.err_r), until_eof=False)
        statuses = {}
        kill_all(statuses)
        if status is None:
            status, usage = statuses.get(repl.pid, (None, None))
        repl.capture.drain((repl.out_r, repl.err_r), until_eof=True)
        repl.close()
        state["repl"] = None
        clean_after_run()
        notes.append("[sandbox] the interpreter ended; the next call starts a fresh session")
        if repl.capture.overflow:
            reason = "output_limit"
        exit_code, reason = classify(status, usage, bytes(repl.capture.buffers[repl.err_r][-512:]), limits,
                                     reason)
    stdout, stderr = repl.capture.result()
    if notes:
        stderr = b64(base64.b64decode(stderr) + ("\n".join(notes) + "\n").encode())
    return {"stdout": stdout, "stderr": stderr, "exit_code": exit_code, "timed_out": reason == "timeout",
            "killed_reason": reason, "duration_s": duration, "truncated": repl.capture.overflow}


# --- main loop -----------------------------------------------------------------------------------------


def serve():
    state = {}
    write_frame(1, {"ready": True, "pid1": os.getpid() == 1})
    while True:
        req = read_frame(0)
        if req is None or req.get("op") == "shutdown":
            break
        try:
            if req["op"] == "run":
                reply = handle_run(req)
            elif req["op"] == "exec":
                reply = handle_exec(req, state)
            elif req["op"] == "ping":
                reply = {"ok": True}
            else:
                reply = {"error": f"unknown op {req['op']!r}"}
        except Exception as exc:  # a broken request must not take the worker down
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        write_frame(1, reply)
    if state.get("repl") is not None:
        state["repl"].close()
    kill_all({})
    clean_after_run()


def main():
    CONFIG.update(json.loads(sys.argv[1]))
    CONFIG["pid1"] = os.getpid() == 1
    # As a namespace's init we receive only signals we handle; ignore SIGINT so code inside cannot
    # raise KeyboardInterrupt in the server.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not CONFIG["pid1"]:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    # The modules every child needs, then the caller's choice.
    for name in ("atexit", "linecache", "traceback", "types", *CONFIG.get("preload", ())):
        try:
            __import__(name)
        except Exception:
            pass
    # Preloading happens first: after the drop, modules under a directory only root may enter (a Python
    # installed in /root, say) can no longer be imported.
    drop_privileges(CONFIG.get("drop"))
    # Changing uid cleared bubblewrap's --die-with-parent signal: ask for it again, so that killing the
    # worker from the host takes this namespace (and every process in it) down.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_DUMPABLE, 0)  # code running as our uid must not reach our fds or memory via /proc
    os.umask(0o077)
    for directory in CONFIG["scratch"]:
        os.makedirs(directory, exist_ok=True)
    # What every child needs, done once here rather than after each fork (each touched page is a fault).
    workdir = os.path.join(CONFIG["scratch"][0], "run" if CONFIG["kind"] == "pool" else "session")
    sys.argv = ["main.py"]
    sys.path.insert(0, workdir)
    os.environ["HOME"] = workdir
    import gc

    gc.collect()
    gc.freeze()  # forked children then share these pages instead of copying them on the first collection
    serve()


if __name__ == "__main__":
    main()
