"""Metacontroller hooks written as ``http.server`` handlers, run unchanged as wasmop modules.

Metacontroller's Python hooks are a ``BaseHTTPRequestHandler`` subclass whose ``do_POST`` reads
the request and answers with ``send_response``, ``send_header``, ``end_headers`` and
``wfile.write``, served by ``HTTPServer(('', 80), Controller).serve_forever()`` at the end of
the file. ``scripts/python-module.sh hook HOOK.py OUT.wasm`` builds such a file, unchanged, into
a component of the ``hook`` world; its generated entry is::

    Hooks = hook.export(hook.load(hook.on_path("sync.py")))

``load`` runs the file at build time (componentize-py keeps the state it leaves) with
``http.server.HTTPServer`` replaced by ``HookServer``, which records the handler class and stops
the file where it would serve. Each call is then one POST, answered as the server would answer
it: a handler without a socket reads the request from ``rfile`` (headers parsed by
``BaseHTTPRequestHandler`` itself) and writes its answer to ``wfile``; the status line and the
body it wrote are the result. What it logs (``logging``, ``print``, ``log_message``) goes to the
host's log, a bounded number of bounded lines a call.
"""

from __future__ import annotations

import http.server
import io
import logging
import os
import re
import sys
import traceback
import types
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from . import log
from .errors import Error
from .log import Level

OUTPUT_MAX = 4 << 20
"""The most bytes of body a hook may answer: the host's cap on a response."""
HEADERS_MAX = 64 << 10
"""The most bytes of status line and headers a hook may answer."""
MESSAGE_MAX = 4096
"""The most characters of an error's message (the body of a non-2xx answer)."""
LOG_LINE_MAX = 4096
"""The most characters of a log line (longer ones are cut), as the host's."""
LOG_LINES_MAX = 500
"""The most log lines of a call; one more line says how many were dropped."""

_CLIENT = ("wasmop", 0)
_PATH = re.compile(r"/[!-~]*")
_STATUS = re.compile(rb"HTTP/\d(?:\.\d)? (\d{3})")


@dataclass
class Answer:
    """What a hook answered to one POST: its HTTP status and body."""

    status: int
    body: str

    @property
    def ok(self) -> bool:
        """Whether the status is 2xx: the body is the hook's response document."""
        return 200 <= self.status < 300


class _Served(BaseException):
    """Raised by ``HookServer.serve_forever`` to stop the hook file where it would serve
    forever (a BaseException, so that the file's ``except Exception`` does not catch it)."""

    def __init__(self, server: "HookServer"):
        super().__init__()
        self.server = server


_made: Optional[list] = None  # the servers the hook file made, while ``load`` runs it


class HookServer:
    """What ``HTTPServer(address, Handler)`` makes in a hook file: no socket, the handler class.

    ``post`` answers one POST as the real server would. Serving (``serve_forever``,
    ``handle_request``) stops the loading of the file: over HTTP it would never return.
    """

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, server_address, RequestHandlerClass, bind_and_activate=True):
        self.server_address = server_address
        self.RequestHandlerClass = RequestHandlerClass
        self.server_name = "hook"
        self.server_port = server_address[1] if isinstance(server_address, tuple) else 80
        if _made is not None:
            _made.append(self)

    def serve_forever(self, poll_interval=0.5):
        raise _Served(self)

    def handle_request(self):
        raise _Served(self)

    def server_close(self):
        pass

    def shutdown(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def post(self, path: str, body: str) -> Answer:
        """The answer of the handler to ``POST path`` with the JSON document ``body``."""
        if not _PATH.fullmatch(path):
            return Answer(400, f"not a request path: {path[:200]!r}")
        out = _Written(OUTPUT_MAX + HEADERS_MAX)
        handler = self._handler(_request(path, body.encode()), out)
        with _captured() as capture:
            try:
                handler.handle_one_request()
            except (Exception, SystemExit) as e:  # over HTTP the connection drops: no answer
                e.with_traceback(e.__traceback__.tb_next)  # from the server's frames on
                capture.write(_STDERR, _traceback(e), Level.ERROR)
                return Answer(500, _described(e))
        return _answer(out)

    def _handler(self, request: bytes, out: "_Written"):
        """An instance of the handler class as ``socketserver`` would make it, without a socket
        (``__init__`` would serve the socket at once)."""
        cls = self.RequestHandlerClass
        handler = cls.__new__(cls)
        handler.request = None
        handler.client_address = _CLIENT
        handler.server = self
        handler.rfile = io.BytesIO(request)
        handler.wfile = out
        handler.close_connection = True
        _access_log_at_debug(handler)
        return handler


def load(path) -> HookServer:
    """Runs the hook file at ``path`` as ``__main__``; returns the ``HTTPServer`` it made.

    Raises ``Error`` if the file made none. The file's directory is put first on ``sys.path``
    (as ``python sync.py`` does), for the modules beside it. What the file writes while it loads
    goes to the real stdout and stderr (at build time); ``logging.basicConfig`` there gets the
    hook's stderr.
    """
    global _made
    _levels_of_records()
    path = str(path)
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module = types.ModuleType("__main__")
    module.__file__ = path
    code = compile(Path(path).read_bytes(), path, "exec")
    _made, served = [], None
    try:
        with _servers_replaced(), _main(module), _streams():
            exec(code, module.__dict__)
    except _Served as s:
        served = s.server
    finally:
        made, _made = _made, None
    if served is None and not made:
        raise Error(f"{path} made no HTTPServer(address, Handler): there is no handler to call")
    return served or made[-1]


def on_path(name: str) -> str:
    """The path of the first file called ``name`` in a directory of ``sys.path`` (the build puts
    the hook's directory first)."""
    for directory in sys.path:
        path = Path(directory or ".") / name
        if path.is_file():
            return str(path)
    raise Error(f"no {name} in a directory of the Python path {sys.path}")


def export(server: HookServer) -> type:
    """The class componentize-py exports for the ``hook`` world (``Hooks``): each call is one
    POST of the request's body to its path; a 2xx answer is the result, another an error."""
    from componentize_py_types import Err
    from wit_world import exports
    from wit_world.exports import hooks

    class Exported(exports.Hooks):
        def call(self, request):
            answer = server.post(request.path, request.body)
            if answer.ok:
                return answer.body
            raise Err(hooks.HookError(status=answer.status, message=answer.body))

    Exported.__name__ = "Hooks"
    return Exported


# Loading.


@contextmanager
def _servers_replaced() -> Iterator[None]:
    """``http.server``'s servers are ``HookServer`` while the file runs."""
    names = ("HTTPServer", "ThreadingHTTPServer")
    saved = {name: getattr(http.server, name) for name in names}
    for name in names:
        setattr(http.server, name, HookServer)
    try:
        yield
    finally:
        for name, server in saved.items():
            setattr(http.server, name, server)


@contextmanager
def _main(module: types.ModuleType) -> Iterator[None]:
    """``module`` is ``sys.modules['__main__']`` while the file runs (as with ``runpy``)."""
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        yield
    finally:
        if saved is None:
            del sys.modules["__main__"]
        else:
            sys.modules["__main__"] = saved


# The request and the answer.


def _request(path: str, body: bytes) -> bytes:
    """The bytes of the POST Metacontroller would send."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: hook\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class _Written(io.BytesIO):
    """The handler's ``wfile``: keeps at most ``limit`` bytes and says whether there were more."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit
        self.over = False

    def write(self, b) -> int:
        n = memoryview(b).nbytes
        if self.tell() + n > self.limit:
            self.over = True
            return n
        return super().write(b)


def _answer(out: _Written) -> Answer:
    written = out.getvalue()
    if not written:
        return Answer(500, "the hook answered nothing (no send_response)")
    head, blank, body = written.partition(b"\r\n\r\n")
    status = _STATUS.match(head)
    if not blank or not status:
        return Answer(500, "the hook answered no status line and headers (send_response and end_headers come first)")
    if out.over or len(body) > OUTPUT_MAX:
        return Answer(500, f"the hook answered more than {OUTPUT_MAX} bytes")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return Answer(500, "the hook answered a body that is not UTF-8")
    answer = Answer(int(status.group(1)), text)
    return answer if answer.ok else Answer(answer.status, _cut(text, MESSAGE_MAX))


_NOT_SHOWN = "its text is not shown, it may carry values: answer a non-2xx status with a body to say more"


def _described(e: BaseException) -> str:
    """The 500's message for ``e``: its type and where it was raised (``KeyError at sync.py:31
    (its text is not shown ...)``), never its text, which often carries values (a Secret's, in a
    ``ValueError``) and would reach the parent's Events and the host's log (as the SDK's
    ``reconcile`` does)."""
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    return _cut(f"{type(e).__name__}{where} ({_NOT_SHOWN})", MESSAGE_MAX)


def _traceback(e: BaseException) -> str:
    """``e``'s traceback as Python writes it (its frames, and those of its cause or context),
    with each exception's line reduced to its type: its text, and its notes, may carry values."""
    chain, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ if e.__cause__ is not None else (None if e.__suppress_context__ else e.__context__)
    parts = []
    for i, e in enumerate(reversed(chain)):
        if i:
            inner = chain[len(chain) - i]  # the one written just before
            parts.append(
                "\nThe above exception was the direct cause of the following exception:\n\n"
                if e.__cause__ is inner
                else "\nDuring handling of the above exception, another exception occurred:\n\n"
            )
        if e.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(traceback.format_tb(e.__traceback__))
        parts.append(f"{type(e).__name__} ({_NOT_SHOWN})\n")
    return "".join(parts)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Logging.

_line_level: Optional[Level] = None  # the level of the lines being written, if not the stream's


@contextmanager
def _lines_at(level: Level) -> Iterator[None]:
    global _line_level
    outer, _line_level = _line_level, level
    try:
        yield
    finally:
        _line_level = outer


def _level_of(levelno: int) -> Level:
    """The host's level for a ``logging`` level."""
    for floor, level in ((logging.ERROR, Level.ERROR), (logging.WARNING, Level.WARN),
                         (logging.INFO, Level.INFO), (logging.DEBUG, Level.DEBUG)):
        if levelno >= floor:
            return level
    return Level.TRACE


def _levels_of_records() -> None:
    """Makes every ``logging`` handler write a record's lines at the record's level (a
    ``StreamHandler`` on the hook's stderr only writes text). Once."""
    handle = logging.Handler.handle
    if getattr(handle, "_wasmop_levels", False):
        return

    def handle_at_level(self, record):
        with _lines_at(_level_of(record.levelno)):
            return handle(self, record)

    handle_at_level._wasmop_levels = True
    logging.Handler.handle = handle_at_level


def _access_log_at_debug(handler) -> None:
    """The server's line for each request (``"POST /sync HTTP/1.1" 200 -``) at debug level."""
    log_request = handler.log_request

    def at_debug(code="-", size="-"):
        with _lines_at(Level.DEBUG):
            log_request(code, size)

    handler.log_request = at_debug


class _Capture:
    """The log lines of one call: complete lines go to the sink, at most ``LOG_LINES_MAX``."""

    def __init__(self, sink):
        self.sink = sink
        self.partial: dict = {}  # stream -> the text after its last newline
        self.kept = 0
        self.dropped = 0
        self.sinking = False  # the sink's own writes (natively, to stderr) are not lines again

    def write(self, stream: "_Stream", text: str, level: Level) -> None:
        lines = (self.partial.pop(stream, "") + text).split("\n")
        rest = lines.pop()
        for line in lines:
            self.line(level, line)
        if len(rest) > LOG_LINE_MAX:
            self.line(level, rest)
        elif rest:
            self.partial[stream] = rest

    def line(self, level: Level, text: str) -> None:
        text = text.rstrip()
        if not text:
            return
        if self.kept >= LOG_LINES_MAX:
            self.dropped += 1
            return
        self.kept += 1
        self._send(level, _cut(text, LOG_LINE_MAX))

    def close(self) -> None:
        for stream, rest in self.partial.items():
            self.line(stream.level, rest)
        self.partial.clear()
        if self.dropped:
            self._send(Level.WARN, f"{self.dropped} more log lines dropped (at most {LOG_LINES_MAX} a call)")

    def _send(self, level: Level, text: str) -> None:
        self.sinking = True
        try:
            self.sink(level, text)
        finally:
            self.sinking = False


_capture: Optional[_Capture] = None  # the capture of the call running


class _Stream(io.TextIOBase):
    """The hook's ``sys.stdout`` or ``sys.stderr``: during a call its lines are logged; outside
    one (the file loading at build time), and from the log's sink, the text goes to the real
    stream."""

    encoding = "utf-8"

    def __init__(self, name: str, level: Level):
        super().__init__()
        self.name = name
        self.level = level

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if _capture is not None and not _capture.sinking:
            _capture.write(self, text, self.level if _line_level is None else _line_level)
        else:
            real = getattr(sys, f"__{self.name}__", None)
            if real is not None:
                real.write(text)
        return len(text)


_STDOUT = _Stream("stdout", Level.INFO)
_STDERR = _Stream("stderr", Level.INFO)


@contextmanager
def _streams() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` are the hook's streams meanwhile."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _STDOUT, _STDERR
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


@contextmanager
def _captured() -> Iterator[_Capture]:
    """What the hook writes meanwhile is logged, as the lines of one call."""
    global _capture
    capture = _Capture(log.log)
    _capture = capture
    try:
        with _streams():
            yield capture
    finally:
        _capture = None
        capture.close()
