"""What a run's process does between the fork and the code: stdio, limits, then the code as ``__main__``."""

import os
import resource
import signal
import sys

from .procs import fresh_session_keyring
from .wire import CONFIG, PR_SET_DUMPABLE, PR_SET_PDEATHSIG, SETUP_FAILED_EXIT, prctl


def apply_limits(limits, cpu_soft=None):
    mb = 1024 * 1024
    cpu = int(limits["cpu_seconds"] + 0.999)
    settings = [
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_FSIZE, limits["file_size_mb"] * mb, limits["file_size_mb"] * mb),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
        # The server and the zygote are processes of this uid in the namespace too, hence the +2.
        (resource.RLIMIT_NPROC, limits["max_processes"] + 2, limits["max_processes"] + 2),
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
    # A run may read its own /proc/self (the zygote and server may not be read); and runs, not the server,
    # are what the kernel's OOM killer should pick when the worker's memory cgroup is full. The order
    # matters: while undumpable, /proc/self/oom_score_adj belongs to root and the write is refused.
    prctl(PR_SET_DUMPABLE, 1)
    try:  # (os.open, not open(): no io objects built, so fewer pages copied after the fork)
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, b"1000")
        finally:
            os.close(fd)
    except OSError:
        pass
    fresh_session_keyring()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    # (A preloaded random module was reseeded by the fork itself: it registers a reseed with
    # os.register_at_fork, which both os.fork and the zygote's clone run. Seeding again cost a page.)


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


def run_main(code, prelude=None):
    """Run ``code`` as ``__main__``; ``prelude``: a module holding a prelude's globals (load_prelude), which
    this process, a fork, may use as its own (copying its names would write to the page of each)."""
    if prelude is None:
        import types

        prelude = types.ModuleType("__main__")
    main = prelude
    main.__file__ = "main.py"
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


def start_run(workdir, fds, prelude):
    """In a freshly forked process: take the run's fds (stdin, stdout, stderr, payload), read the code from
    the payload fd, apply the limits and run it. Never returns."""
    import json

    stdin_fd, out_w, err_w, payload_fd = fds[:4]
    try:
        become_child(workdir, stdin_fd, out_w, err_w, keep_fds=(payload_fd,))
        os.lseek(payload_fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(payload_fd, 1 << 20):
            chunks.append(chunk)
        os.close(payload_fd)
        payload = json.loads(b"".join(chunks))
        del chunks
        apply_limits(payload["limits"])
    except BaseException as exc:
        os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
        os._exit(SETUP_FAILED_EXIT)
    os._exit(run_main(payload["code"], prelude))
