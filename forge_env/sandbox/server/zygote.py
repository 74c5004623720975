"""The zygote: a clean interpreter that forks every run, so no run starts from memory that held another's.

The server (PID 1 of the sandbox) reads every request, so its heap holds earlier runs' code and output.
It therefore never forks runs itself: at start it launches a zygote, a fresh ``exec`` of this same program
that preloads modules, builds the (trusted) preludes and then only ever receives, on a unix socket,
"fork a run" orders carrying file descriptors (stdin, stdout, stderr, and a memfd with the code). The
zygote forks with ``CLONE_PARENT``, so each run is the server's child (the server waits for it, reads its
rusage and kills it), and the child reads its code from the memfd only after the fork: the zygote never
holds a run's code or output, and neither does any later run forked from it.

A run shares the zygote's uid and could kill or stop it; the server resumes it before every order and
replaces it when it is gone (a fresh ``exec`` again).
"""

import ctypes
import json
import marshal
import os
import signal
import socket
import sys

from .child import start_run
from .procs import drop_privileges, fresh_session_keyring, untouched
from .wire import CONFIG, LIBC, PR_SET_DUMPABLE, PR_SET_PDEATHSIG, data_fd, prctl, read_fd

CLONE_PARENT = 0x00008000
SYS_CLONE = {"x86_64": 56, "aarch64": 220}
ZYGOTE_FD = 3
CODE_FD = 4
#: The zygote's program: this server's code, compiled by the server (see Zygote.__init__).
ZYGOTE_BOOT = ("import marshal, os; _code = marshal.loads(os.pread(4, os.fstat(4).st_size, 0)); os.close(4); "
               "exec(_code)")
ORDER_TIMEOUT_S = 10.0
#: An order is a workdir and a prelude key. Kept small because after each fork every page the zygote
#: writes (a 64 KiB receive buffer included) is a copy-on-write fault.
ORDER_BYTES = 4096
MAX_PRELUDES = 16
PRELUDES = {}
#: A function a prelude may define (trusted code, like the rest of it), called once after the prelude is
#: built and before any run forks from it: it exercises what runs will execute, so that the interpreter's
#: warm-up writes (specialized bytecode, type caches) happen once here instead of after every fork, where
#: each is a copy-on-write fault. It must not read files or change global state (every run inherits it).
WARM_UP = "__forge_warm_up__"


def load_prelude(key, source):
    """A ``__main__`` module holding the globals left by running ``source`` (trusted setup code), built once
    per distinct text: each run forked with it runs its code in it (its own copy, after the fork)."""
    module = PRELUDES.get(key)
    if module is None:
        import builtins
        import types

        if len(PRELUDES) >= MAX_PRELUDES:
            PRELUDES.pop(next(iter(PRELUDES)))
        module = types.ModuleType("__main__")
        module.__builtins__ = builtins
        exec(compile(source, "<prelude>", "exec"), module.__dict__)
        warm_up = module.__dict__.get(WARM_UP)
        if callable(warm_up):
            try:
                warm_up()
            except Exception:
                pass  # (only ever a missed saving)
        PRELUDES[key] = module
        settle()
    return module


def settle():
    """Freeze what is built so far and hand the allocator's free memory back to the kernel: every page
    mapped here is a page-table entry that each fork copies and each run's exit tears down."""
    import gc

    gc.collect()
    gc.freeze()  # forked children then share these pages instead of copying them on the first collection
    try:
        LIBC.malloc_trim(0)
    except AttributeError:  # not glibc
        pass


def prelude_key(source):
    import hashlib  # imported by Runner (server only): the zygote never hashes, and libcrypto makes forks dearer

    return hashlib.sha256(source.encode()).hexdigest() if source else None


_syscall = ctypes.PyDLL(None, use_errno=True).syscall  # PyDLL: the GIL stays held across the clone
_syscall.restype = ctypes.c_long
# Looked up here, once: ctypes finds a function on its first use (dlsym through every loaded library's
# symbol tables, a new function object stored on ``pythonapi``), and a lookup done after the fork would
# be done again by every run, at ~50 page faults each (PyOS_AfterFork_Child is only ever called there).
_before_fork = ctypes.pythonapi.PyOS_BeforeFork
_after_fork_parent = ctypes.pythonapi.PyOS_AfterFork_Parent
_after_fork_child = ctypes.pythonapi.PyOS_AfterFork_Child


def clone_parent():
    """fork(), except that the child's parent is our parent (the server), which can then wait for it."""
    _before_fork()
    pid = _syscall(ctypes.c_long(SYS_CLONE[os.uname().machine]),
                       ctypes.c_long(CLONE_PARENT | signal.SIGCHLD), ctypes.c_long(0), ctypes.c_long(0),
                       ctypes.c_long(0), ctypes.c_long(0))
    if pid == 0:
        _after_fork_child()
        return 0
    _after_fork_parent()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "clone(CLONE_PARENT) failed")
    return pid


def prepare_interpreter():
    """What every run needs, done once before forking (each page touched after a fork is a fault)."""
    workdir = os.path.join(CONFIG["scratch"][0], "run" if CONFIG["kind"] == "pool" else "session")
    sys.argv = ["main.py"]
    sys.path.insert(0, workdir)
    os.environ["HOME"] = workdir
    settle()


def preload():
    for name in ("atexit", "linecache", "traceback", "types", *CONFIG.get("preload", ())):
        try:
            __import__(name)
        except Exception:
            pass


def zygote_main():
    prctl(PR_SET_DUMPABLE, 0)  # first: nothing of the sandbox may read our memory or fds
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload()
    drop_privileges(CONFIG.get("drop"))
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_DUMPABLE, 0)
    fresh_session_keyring()
    os.umask(0o077)
    prepare_interpreter()
    untouched()  # records our state: a run that changes it (prlimit, nice, ...) gets us replaced
    sock = socket.socket(fileno=ZYGOTE_FD)
    sock.sendall(b'{"ready": true}')
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, ORDER_BYTES, 8)
        except OSError:
            os._exit(0)
        if not data:
            os._exit(0)
        order = json.loads(data)
        if not untouched():
            os._exit(0)  # a run lowered our limits or priority: the server starts a fresh zygote
        try:
            prelude = None
            if order.get("prelude"):
                source = read_fd(fds[-1]).decode() if order.get("text") else None
                if order["prelude"] not in PRELUDES and source is None:
                    raise LookupError("prelude not sent")
                prelude = load_prelude(order["prelude"], source)
            pid = clone_parent()
            if pid == 0:
                if order.get("ahead"):
                    wait_for_run(fds, prelude)
                start_run(order["workdir"], fds, prelude)
            reply = b'{"pid": %d}' % pid
        except Exception as exc:
            reply = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
        finally:
            for fd in fds:
                os.close(fd)
        sock.sendall(reply)


def wait_for_run(fds, prelude):
    """A run process forked ahead of its request (Runner.prepare): it holds the run's stdin, stdout,
    stderr and payload fds, which the server fills when the request comes, and ``fds[4]``, the read end of
    a pipe on which the server then writes one byte: "1" (start; stdin is fds[0]) or "0" (start with no
    stdin). Anything else, end of file included, ends it. Never returns."""
    os.close(ZYGOTE_FD)  # else the server would not see end of file when the zygote dies
    wake = fds[4]
    try:
        signal_byte = os.read(wake, 1)
    except OSError:
        signal_byte = b""
    if signal_byte not in (b"0", b"1"):
        os._exit(0)
    os.close(wake)
    run_fds = list(fds[:4])
    if signal_byte == b"0":
        run_fds[0] = os.open(os.devnull, os.O_RDONLY)  # (the unused memfd is closed with the rest)
    start_run(os.path.join(CONFIG["scratch"][0], "run"), run_fds, prelude)


class Zygote:
    """The server's handle on its zygote: start it, order forks, resume or replace it."""

    def __init__(self):
        self.pid = None
        self.sock = None
        self.preludes = {}  # keys of the preludes the zygote holds, oldest first
        with open("/proc/self/cmdline", "rb") as f:  # our own command line: [python, *flags, "-c", source, config]
            argv = [a.decode() for a in f.read().split(b"\0")[:-1]]
        # The zygote is a fresh exec of this program, but it does not parse it: parsing our ~50 KB of source
        # leaves ~4 MB of interpreter memory behind (half the zygote), and every fork copies the page
        # tables of all of it and every run's exit tears them down. It loads the code compiled here (by
        # this same interpreter, so the marshal format matches) from an fd instead.
        self.code_fd = data_fd(marshal.dumps(compile(argv[-2], "<string>", "exec")))
        self.argv = [*argv[:-2], ZYGOTE_BOOT]

    def start(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = dict(CONFIG, role="zygote")
        argv = [*self.argv, json.dumps(config)]
        pid = os.fork()
        if pid == 0:  # only exec follows: nothing of the server's memory survives into the zygote
            try:
                import fcntl

                high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 16) for fd in (theirs.fileno(), self.code_fd)]
                for target, fd in zip((ZYGOTE_FD, CODE_FD), high, strict=True):  # (either may sit at 3 or 4 now)
                    os.dup2(fd, target, inheritable=True)
                os.closerange(CODE_FD + 1, 65536)
                os.execv(sys.executable, argv)
            finally:
                os._exit(127)
        theirs.close()
        ours.settimeout(30.0)
        try:
            hello = ours.recv(64)
        except OSError:
            hello = b""
        if hello != b'{"ready": true}':
            ours.close()
            self._kill(pid)
            raise RuntimeError("the zygote did not start")
        ours.settimeout(ORDER_TIMEOUT_S)
        self.pid, self.sock, self.preludes = pid, ours, {}

    def fork_run(self, workdir, fds, prelude):
        """The pid of a new run process (a child of ours) holding ``fds``, starting with the globals of
        ``prelude`` ((key, text) or None); replaces a zygote that is gone."""
        return self._retried({"workdir": workdir}, fds, prelude)

    def fork_ahead(self, fds, prelude):
        """The pid of a new run process holding ``fds`` (stdin, stdout, stderr, payload, wake: see
        wait_for_run) that starts the run when woken."""
        return self._retried({"ahead": True}, fds, prelude)

    def _retried(self, order, fds, prelude):
        for attempt in (1, 2):
            if self.pid is None:
                self.start()
            try:
                return self._order(order, fds, prelude)
            except (OSError, ValueError):
                self.stop()
                if attempt == 2:
                    raise

    def _order(self, order, fds, prelude):
        os.kill(self.pid, signal.SIGCONT)  # a run may have stopped it
        key, text = prelude or (None, None)
        extra = []
        if key and key not in self.preludes:
            extra.append(data_fd(text.encode()))
        try:  # (the workdir is the server's own short path: the order fits ORDER_BYTES)
            socket.send_fds(self.sock, [json.dumps({**order, "prelude": key, "text": bool(extra)}).encode()],
                            list(fds) + extra)
        finally:
            for fd in extra:
                os.close(fd)
        reply = self.sock.recv(1 << 16)
        if not reply:
            raise OSError("the zygote is gone")
        reply = json.loads(reply)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        if key and key not in self.preludes:
            self.preludes[key] = True
            if len(self.preludes) > MAX_PRELUDES:  # the zygote drops its oldest too (load_prelude)
                self.preludes.pop(next(iter(self.preludes)))
        return reply["pid"]

    def forget(self, pid):
        """The zygote ``pid`` was reaped (a run killed it): start a new one on the next order."""
        if pid == self.pid:
            self.sock.close()
            self.pid, self.sock = None, None

    def stop(self):
        if self.pid is not None:
            self.sock.close()
            self._kill(self.pid)
            self.pid, self.sock = None, None

    @staticmethod
    def _kill(pid):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
