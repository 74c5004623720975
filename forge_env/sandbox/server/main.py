"""The fork server's entry point: the request loop of a worker (PID 1 of its sandbox), or the zygote.

The host starts one server per worker and talks to it over fd 0 (requests) and fd 1 (responses). Ops:

- ``run``: a fresh process (forked by the zygote, see ``zygote.py``) runs the code as ``__main__`` in a
  fresh working directory under the rlimits, its stdout/stderr captured (capped) until it exits or its
  deadline passes; then every process it left is killed and everything it wrote is wiped. A reply
  carries ``retire`` when that cleanup failed: the host then replaces the worker.
- ``exec`` (session workers): a cell in a long-lived REPL child (``repl.py``).

This program runs inside the sandbox with ``python -c`` (the parts of this package concatenated), so it
uses the standard library only. As PID 1 of its own PID namespace, code inside cannot signal it (the
kernel shields a namespace's init); elsewhere it is a child subreaper and walks /proc to find what a
run left behind.
"""

import json
import os
import signal
import sys

from .procs import drop_privileges, fresh_session_keyring, kill_all, untouched
from .repl import handle_exec
from .runs import Runner, clean_after_run
from .wire import (
    CONFIG,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    PR_SET_PDEATHSIG,
    PR_SET_THP_DISABLE,
    prctl,
    read_frame,
    write_frame,
)
from .zygote import preload, prepare_interpreter, zygote_main


def serve(runner):
    state = {}
    write_frame(1, {"ready": True, "pid1": CONFIG["pid1"], "zygote": runner is not None and runner.zygote is not None})
    while True:
        req = read_frame(0)
        if req is None or req.get("op") == "shutdown":
            break
        try:
            if req["op"] == "run":
                reply = runner.handle(req)
            elif req["op"] == "exec":
                reply = handle_exec(req, state)
            elif req["op"] == "ping":
                reply = {"ok": True}
            else:
                reply = {"error": f"unknown op {req['op']!r}"}
        except Exception as exc:  # a broken request must not take the worker down
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        write_frame(1, reply)
        if runner is not None:
            runner.prepare()  # while the host reads the reply
    if state.get("repl") is not None:
        state["repl"].close()
    if runner is not None:
        runner.close()
    kill_all({})
    clean_after_run({})


def main():
    CONFIG.update(json.loads(sys.argv[1]))
    if CONFIG.get("role") == "zygote":
        zygote_main()
        return
    CONFIG["pid1"] = os.getpid() == 1
    # As a namespace's init we receive only signals we handle; ignore SIGINT so code inside cannot
    # raise KeyboardInterrupt in the server.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    prctl(PR_SET_DUMPABLE, 0)
    if not CONFIG.get("huge_pages"):
        # No transparent huge pages for us, the zygote and the runs (inherited, kept across exec): where THP
        # is "always", the zygote's memory may sit in 2 MB pages, and each run's first write to one is a
        # fault that splits it (or, on older kernels, copies all 2 MB). Forks copy small pages' entries.
        prctl(PR_SET_THP_DISABLE, 1)
    if not CONFIG["pid1"]:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
    os.umask(0o077)
    for directory in CONFIG["scratch"]:
        os.makedirs(directory, exist_ok=True)
    runner = None
    if CONFIG["kind"] == "pool":
        # Started while we may still change uid: the zygote preloads, then drops to the same uid itself.
        runner = Runner()
    else:
        preload()  # a session's REPL forks from us
    # Preloading happens before the drop: after it, modules under a directory only root may enter (a
    # Python installed in /root, say) can no longer be imported.
    drop_privileges(CONFIG.get("drop"))
    # Changing uid cleared bubblewrap's --die-with-parent signal: ask for it again, so that killing the
    # worker from the host takes this namespace (and every process in it) down.
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    prctl(PR_SET_DUMPABLE, 0)  # code running as our uid must not reach our fds or memory via /proc
    fresh_session_keyring()
    untouched()  # records our state (see clean_after_run)
    if CONFIG["kind"] != "pool":
        prepare_interpreter()
    serve(runner)


if __name__ == "__main__":
    main()
