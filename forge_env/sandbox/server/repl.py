"""Session workers: one long-lived REPL child per worker that keeps its globals between calls.

A session worker serves a single session, so its REPL forks from the server directly: the only earlier
requests in the server's memory are that same session's cells.
"""

import base64
import json
import os
import resource
import select
import struct
import sys
import time

from .capture import Capture, watch, widen_pipes
from .child import apply_limits, become_child, exit_status, print_exception, register_source
from .procs import kill_all
from .runs import classify, clean_after_run, ran_out_of_memory, stdin_fd_for, write_files
from .wire import CONFIG, SETUP_FAILED_EXIT, b64, read_frame, write_frame

#: The REPL's report after a cell (``{"exit_code": n}``) is one small frame written at once; the cell
#: holds the pipe's write end too, so what comes on it is read by a deadline and checked.
MAX_REPORT_BYTES = 4096
REPORT_GRACE_S = 1.0


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
        fd = stdin_fd_for(req.get("stdin"))
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


def read_report(fd, deadline):
    """The REPL's report on ``fd`` (``{"exit_code": int}``, one frame and nothing more), or None when by
    ``deadline`` there is none, half of one, more than one or anything else. The cell can write on this
    pipe (or close its end and sleep): a blocking read hung the server past the host's deadline, and the
    host counted a lost worker (for the python tool, code could end its episode as the machine's failure)."""
    data = b""
    while True:
        if len(data) >= 4:
            size = struct.unpack(">I", data[:4])[0]
            if size > MAX_REPORT_BYTES or len(data) > 4 + size:
                return None
            if len(data) == 4 + size:
                try:
                    reply = json.loads(data[4:])
                except ValueError:
                    return None
                return reply if type(reply) is dict and type(reply.get("exit_code")) is int else None
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, 4 + MAX_REPORT_BYTES + 1 - len(data))
        if not chunk:
            return None
        data += chunk


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
                apply_limits(limits, cpu_soft=int(limits["cpu_seconds"] + 0.999))
            except BaseException as exc:
                os.write(2, f"sandbox setup failed: {exc!r}\n".encode())
                os._exit(SETUP_FAILED_EXIT)
            repl_main(cmd_r, res_w, limits)
        for fd in (cmd_r, res_w, out_w, err_w, devnull):
            os.close(fd)
        widen_pipes((self.out_r, self.err_r), limits["max_output_bytes"])  # (the server reads them every poll)
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
        reply = read_report(repl.res_r, time.monotonic() + REPORT_GRACE_S)
        if reply is not None:
            exit_code = reply["exit_code"]
            repl.capture.drain((repl.out_r, repl.err_r), until_eof=False)
            if exit_code and ran_out_of_memory(bytes(repl.capture.buffers[repl.err_r][-512:])):
                reason = "memory"
        else:  # no report: the REPL died right after its cell, or the cell wrote on (or closed) its pipe
            outcome = "broken"  # the REPL may still run: killed below, never waited for
    if outcome == "exited" and status is None:
        _, status, usage = os.wait4(repl.pid, 0)
    if exit_code is None:
        reason = None if outcome in ("exited", "broken") else outcome
        if outcome in ("exited", "broken"):
            repl.capture.drain((repl.out_r, repl.err_r), until_eof=False)
        statuses = {}
        kill_all(statuses)
        if status is None:
            status, usage = statuses.get(repl.pid, (None, None))
        repl.capture.drain((repl.out_r, repl.err_r), until_eof=True)
        repl.close()
        state["repl"] = None
        problems = clean_after_run({})
        if problems:
            raise RuntimeError("cleanup failed: " + "; ".join(problems))
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
