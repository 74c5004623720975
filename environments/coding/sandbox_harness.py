"""The grading programs that run inside the sandbox (as a prelude: see harness.py for the design).

Standard library only: its text is sent to the sandbox and built once per worker (the host imports it
only for ``encode_value``/``decode_value``). ``_forge_harness()`` is the judge (the run's process) and
``_candidate`` runs in the process it forks; ``_forge_calls()`` answers a list of calls in one process.
Kept whole: its text is the one program sent to the sandbox as a prelude (by digest), so it stays one file.
"""

import builtins as _builtins
import ctypes as _ctypes
import gc as _gc
import io as _io
import json as _json
import math as _math
import os as _os
import socket as _socket
import struct as _struct
import sys as _sys
import traceback as _traceback
import types as _types

_MAX_MESSAGE = 64 << 20
_MAX_DEPTH = 200
_TAGS = {"t": tuple, "s": set, "f": frozenset}


def encode_value(value, depth=0):
    """Plain data as JSON-able values (lists stay lists; other containers are tagged)."""
    if depth > _MAX_DEPTH:
        raise ValueError("the value is nested too deeply")
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if _math.isfinite(value) else {"F": repr(float(value))}
    if isinstance(value, list):
        return [encode_value(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"t": [encode_value(v, depth + 1) for v in value]}
    if isinstance(value, frozenset):
        return {"f": [encode_value(v, depth + 1) for v in value]}
    if isinstance(value, set):
        return {"s": [encode_value(v, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {"d": [[encode_value(k, depth + 1), encode_value(v, depth + 1)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        return {"b": bytes(value).hex()}
    if isinstance(value, complex):
        return {"c": [repr(value.real), repr(value.imag)]}
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalars and arrays
        return encode_value(value.tolist(), depth + 1)
    raise TypeError(f"a {type(value).__name__} is not plain data (None, bool, int, float, str, bytes, "
                    f"complex, or lists, tuples, dicts and sets of them)")


def decode_value(value):
    """The inverse of encode_value, building only builtin types (whatever the other side sent)."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [decode_value(v) for v in value]
    if kind is dict and len(value) == 1:
        (tag, body), = value.items()
        if tag in _TAGS and type(body) is list:
            return _TAGS[tag](decode_value(v) for v in body)
        if tag == "d" and type(body) is list:
            return {decode_value(k): decode_value(v) for k, v in body}
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if tag == "c" and type(body) is list and len(body) == 2:
            return complex(float(body[0]), float(body[1]))
        if tag == "F" and type(body) is str:
            return float(body)
    raise ValueError("malformed value")


def _send(sock, message):
    data = _json.dumps(message).encode()
    sock.sendall(_struct.pack(">I", len(data)) + data)


class _Reader:
    """Length-prefixed JSON messages from a blocking socket."""

    def __init__(self, sock):
        self.sock, self.buffer = sock, bytearray()

    def _fill(self, n):
        while len(self.buffer) < n:
            chunk = self.sock.recv(max(n - len(self.buffer), 1 << 16))
            if not chunk:
                return False
            self.buffer += chunk
        return True

    def recv(self):
        if not self._fill(4):
            return None
        size = _struct.unpack(">I", self.buffer[:4])[0]
        if size > _MAX_MESSAGE:
            raise ValueError(f"oversized message ({size} bytes)")
        if not self._fill(4 + size):
            return None
        body = bytes(self.buffer[4:4 + size])
        del self.buffer[:4 + size]
        return _json.loads(body)


def _describe(exc):
    # Only the solution's own frames: the failing test is shown separately, the harness is noise.
    remote = getattr(exc, "_forge_remote", None)
    if remote is not None:
        return remote
    frames = [f for f in _traceback.extract_tb(exc.__traceback__) if f.filename == "solution.py"]
    text = "".join(_traceback.format_list(frames[-3:]) + _traceback.format_exception_only(type(exc), exc))
    return text[-1500:]


def _register(name, source):
    import linecache

    linecache.cache[name] = (len(source), None, source.splitlines(True), name)


def _builtin_name(exc):
    for cls in type(exc).__mro__:
        if cls.__module__ == "builtins" and issubclass(cls, Exception):
            return cls.__name__
    return "RuntimeError"


# --- the candidate: runs the solution, answers calls (untrusted from the first line of the solution) ---


class _Tail(_io.TextIOBase):
    """Keeps the last ``keep`` characters written (the solution may print a lot)."""

    def __init__(self, keep):
        self.parts, self.size, self.keep = [], 0, keep

    def writable(self):
        return True

    def write(self, text):
        self.parts.append(text)
        self.size += len(text)
        while self.size > 2 * self.keep and len(self.parts) > 1:
            self.size -= len(self.parts.pop(0))
        return len(text)

    def value(self):
        return "".join(self.parts)[-self.keep:]


def _candidate(sock, keep):
    null = _os.open(_os.devnull, _os.O_RDWR)
    for fd in (0, 1, 2):
        _os.dup2(null, fd)
    fd = sock.fileno()
    _os.closerange(3, fd)
    _os.closerange(fd + 1, 65536)
    _sys.stdout = _sys.stderr = captured = _Tail(keep)
    reader = _Reader(sock)
    namespace = {"__name__": "solution", "__builtins__": _builtins}
    while True:
        try:
            order = reader.recv()
        except Exception:
            order = None
        if order is None:
            _os._exit(0)
        if type(order) is dict and order.get("op") == "load" and type(order.get("source")) is str:
            _register("solution.py", order["source"])
        _send(sock, _answer(order, namespace, captured))


def _answer(order, namespace, captured):
    """The candidate's reply to one order of the judge's."""
    try:
        if order["op"] == "output":
            reply = {"output": str(captured.value())}
        elif order["op"] == "load":
            exec(compile(order["source"], "solution.py", "exec"), namespace)
            names = {}
            for name, value in list(namespace.items()):
                if name.startswith("__"):
                    continue
                if isinstance(value, _types.ModuleType):  # the judge imports its own copy
                    names[name] = {"module": str(value.__name__)}
                elif callable(value):
                    names[name] = {"callable": True}
                else:
                    try:
                        names[name] = {"value": encode_value(value)}
                    except Exception:
                        pass
            reply = {"names": names}
        else:
            function = namespace[order["name"]]
            args = decode_value(order["args"])
            kwargs = {k: decode_value(v) for k, v in order["kwargs"].items()}
            reply = {"value": encode_value(function(*args, **kwargs))}
    except BaseException as exc:  # SystemExit included: the solution may not end the process
        if isinstance(exc, TypeError) and "is not plain data" in str(exc):
            reply = {"raised": "TypeError", "error": f"the solution returned a value the tests cannot "
                     f"compare outside the sandbox: {exc}"}
        else:
            reply = {"raised": _builtin_name(exc), "error": _describe(exc)}
    return reply


# --- the judge: runs the tests, compares plain values, reports -----------------------------------------


class _CandidateGone(RuntimeError):
    pass


class _Channel:
    """The judge's end of the candidate's socket: calls into the solution."""

    def __init__(self, sock):
        self.sock, self.reader, self.gone = sock, _Reader(sock), None

    def ask(self, message):
        if self.gone is not None:
            raise _CandidateGone(self.gone)
        try:
            _send(self.sock, message)
            reply = self.reader.recv()
        except OSError:
            reply = None
        if type(reply) is not dict:
            self.gone = "the solution's process ended (it exited, crashed or was killed)"
            raise _CandidateGone(self.gone)
        return reply

    def call(self, name, args, kwargs):
        reply = self.ask({"op": "call", "name": name, "args": encode_value(list(args)),
                          "kwargs": {str(k): encode_value(v) for k, v in kwargs.items()}})
        if "value" in reply:
            return decode_value(reply["value"])
        cls = getattr(_builtins, str(reply.get("raised")), None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            cls = RuntimeError
        text = str(reply.get("error", ""))[-1500:]
        error = cls(text)
        error._forge_remote = text
        raise error

    def output(self):
        try:
            return str(self.ask({"op": "output"}).get("output", ""))
        except _CandidateGone:
            return ""


class _Remote:
    """A function of the solution, called in the candidate's process."""

    def __init__(self, channel, name):
        self._channel, self.__name__ = channel, name

    def __call__(self, *args, **kwargs):
        return self._channel.call(self.__name__, args, kwargs)

    def __repr__(self):
        return f"<solution function {self.__name__}>"


_prctl = _ctypes.CDLL(None).prctl


def _prctl_undumpable():
    _prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE: no /proc/<pid>/mem, fd or ptrace for our uid


def _installed_module(name):
    """The judge's own import of a module the solution imported (tests such as ``math.isclose(...)`` rely
    on the solution's ``import math``), found only in the interpreter's read-only directories: never in
    the working directory, where the candidate may have written a module of that name."""
    if type(name) is not str or not name or name.startswith("."):
        return None
    import importlib

    here, saved = _os.getcwd(), _sys.path[:]
    _sys.path[:] = [p for p in saved if p not in ("", ".") and p != here and not p.startswith(here + "/")]
    try:
        _os.chdir("/")  # nothing an import reads from its current directory comes from the candidate
        return importlib.import_module(name)
    except BaseException:
        return None
    finally:
        _sys.path[:] = saved
        _os.chdir(here)


def _forge_harness():
    _prctl_undumpable()
    _gc.disable()  # short-lived processes: a collection would only copy pages shared with the zygote
    _sys.set_int_max_str_digits(0)
    ours, theirs = _socket.socketpair()
    candidate = _os.fork()
    if candidate == 0:
        ours.close()
        _candidate(theirs, 2000)
    theirs.close()
    # Only now read what to test (the candidate was forked without it), then close stdin for good.
    payload = _json.loads(_sys.stdin.buffer.read())
    null = _os.open(_os.devnull, _os.O_RDONLY)
    _os.dup2(null, 0)
    _os.close(null)
    nonce, steps = payload["nonce"], payload["steps"]
    channel = _Channel(ours)
    _sys.stdout = _io.StringIO()  # what the test code prints is not a report

    def emit(record):
        data = ("\n" + nonce + _json.dumps(record) + "\n").encode()
        while data:
            data = data[_os.write(1, data):]

    namespace = {"__name__": "__main__", "__builtins__": _builtins}
    failure = None
    if payload.get("trusted"):
        try:
            exec(compile(payload["trusted"], "<task>", "exec"), namespace)
        except BaseException as exc:  # the task's own helpers: a failure here is the task's, not the model's
            failure = "task setup failed: " + type(exc).__name__ + ": " + str(exc)[:200]
    try:
        loaded = channel.ask({"op": "load", "source": payload["solution"]})
        if "names" not in loaded:
            raise RuntimeError(loaded.get("error", ""))
        exposed = payload.get("exposed")
        for name, entry in loaded["names"].items():
            if type(name) is not str or (exposed is not None and name not in exposed):
                continue
            if exposed is None and hasattr(_builtins, name):
                continue  # the tests' len, sorted, ... stay the real ones
            if "module" in entry:
                module = _installed_module(entry["module"])
                if module is not None:
                    namespace[name] = module
            elif entry.get("callable"):
                namespace[name] = _Remote(channel, name)
            else:
                namespace[name] = decode_value(entry.get("value"))
    except BaseException as exc:
        failure = "the solution failed to run: " + (getattr(exc, "_forge_remote", None) or str(exc) or repr(exc))
        emit({"load_error": failure})
    for index, (source, is_test) in enumerate(steps):
        name = f"test_{index}.py"
        _register(name, source)
        if failure is not None:
            emit({"step": index, "ok": False, "error": failure})
            continue
        try:
            exec(compile(source, name, "exec"), namespace)
            emit({"step": index, "ok": True})
        except BaseException as exc:
            error = _describe(exc)
            emit({"step": index, "ok": False, "error": error})
            if not is_test:
                failure = "setup failed: " + error
    output = channel.output()[-payload["keep"]:]
    _os.kill(candidate, 9)  # ours to end (cheaper than the server hunting it down)
    _os.waitpid(candidate, 0)
    emit({"done": True, "output": output})


# --- calls only: every test is one call with constant arguments, checked on the host ------------------


def _forge_calls():
    # The expected values never enter the sandbox: the host compares what comes back. The solution may
    # write records itself, but a record only says what it answers, which is what it is graded on.
    payload = _json.loads(_sys.stdin.buffer.read())
    null = _os.open(_os.devnull, _os.O_RDONLY)
    _os.dup2(null, 0)
    _os.close(null)
    nonce, results_fd = payload["nonce"], _os.dup(1)
    captured = _Tail(payload["keep"])
    _sys.stdout = captured
    _gc.disable()
    _sys.set_int_max_str_digits(0)

    def emit(record):
        data = ("\n" + nonce + _json.dumps(record) + "\n").encode()
        while data:
            data = data[_os.write(results_fd, data):]

    _register("solution.py", payload["solution"])
    _calls(payload, emit, captured)


def _calls(payload, emit, captured):
    """Load the solution and make the calls, each reported by ``emit`` as soon as it returns."""
    namespace = {"__name__": "solution", "__builtins__": _builtins}
    try:
        exec(compile(payload["solution"], "solution.py", "exec"), namespace)
    except BaseException as exc:  # SystemExit included: the solution may not end the run
        emit({"load_error": "the solution failed to run: " + _describe(exc)})
        emit({"done": True, "output": captured.value()})
        return
    for index, (name, args, kwargs) in enumerate(payload["calls"]):
        try:
            if name not in namespace:
                raise NameError(f"name {name!r} is not defined")
            result = namespace[name](*decode_value(args), **{k: decode_value(v) for k, v in kwargs.items()})
            emit({"call": index, "value": encode_value(result)})
        except BaseException as exc:
            if isinstance(exc, TypeError) and "is not plain data" in str(exc):
                error = f"the solution returned a value the tests cannot compare outside the sandbox: {exc}"
            else:
                error = _describe(exc)
            emit({"call": index, "raised": _builtin_name(exc), "error": error})
    emit({"done": True, "output": captured.value()})


# --- warming up: run once by the sandbox's zygote after it builds this prelude --------------------------


#: A sample solution and calls for the warm-up: trusted, constant, and every kind of value the wire carries.
_WARM_UP = {
    "solution": "def f(a, b=0, *rest):\n    return [a, b, (a, b), {a: b}, {a}, frozenset(), str(a) * 2, 1.5, None, True,"
                " b'x', 1j]\n",
    "calls": [["f", [1, {"t": [2]}], {}], ["f", ["s"], {"b": {"d": [[1, {"s": [2]}]]}}], ["f", [True, 2.5, None], {}]],
}


def __forge_warm_up__():
    """Run by the zygote once, after building this prelude (forge_env/sandbox/server/zygote.py): the calls-only
    path on a constant sample, so that the code each run executes is already specialized (3.11's adaptive
    interpreter writes into a code object as it warms up) and the type caches hold its lookups; in a run,
    each such write is a copy-on-write page fault. No I/O and no global state is changed: the records go
    to a list, the output to a ``_Tail``, and nothing is registered with ``linecache``."""
    records = []
    payload = _json.loads(_json.dumps(_WARM_UP))
    for _ in range(12):
        records.clear()
        _calls(payload, lambda record: records.append("\n" + _json.dumps(record) + "\n"), _Tail(100))
    for record in records:
        decode_value(_json.loads(record).get("value"))
    _warm_up_judge(payload)


def _warm_up_judge(payload):
    """The judge/candidate path's round trips, both ends in this process over a private socket pair: each
    of the candidate's replies is queued before the judge asks, so nothing ever waits."""
    judge_end, candidate_end = _socket.socketpair()
    try:
        namespace, captured = {"__name__": "solution", "__builtins__": _builtins}, _Tail(100)
        channel, orders = _Channel(judge_end), _Reader(candidate_end)
        tests = {"__name__": "__main__", "__builtins__": _builtins, "f": _Remote(channel, "f")}
        step = compile("assert f(1, (2,))[0] == 1\n", "<warm-up>", "exec")

        def answer(order):
            _send(candidate_end, _answer(order, namespace, captured))

        answer({"op": "load", "source": payload["solution"]})
        channel.ask({"op": "load", "source": payload["solution"]})
        orders.recv()
        for _ in range(12):
            for name, args, kwargs in payload["calls"]:
                answer({"op": "call", "name": name, "args": args, "kwargs": kwargs})
                channel.call(name, decode_value(args), {k: decode_value(v) for k, v in kwargs.items()})
                orders.recv()
            answer({"op": "call", "name": "f", "args": [1, {"t": [2]}], "kwargs": {}})
            exec(step, tests)
            orders.recv()
        answer({"op": "output"})
        channel.output()
        orders.recv()
    finally:
        judge_end.close()
        candidate_end.close()
