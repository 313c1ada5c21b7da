"""Metacontroller http.server hooks through the hook adapter, natively: the sample files under
hooks/ load unchanged, each call is one POST answered as over HTTP, and what they log goes to
the host's log, bounded."""

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wasmop_sdk import Error, hook, log
from wasmop_sdk.log import Level

HOOKS = Path(__file__).parent / "hooks"
WIT = Path(__file__).resolve().parents[3] / "wit" / "reconciler.wit"
PARENT = {
    "apiVersion": "example.com/v1", "kind": "ConfigMapPropagation", "metadata": {"name": "p"},
    "spec": {"sourceName": "settings", "sourceNamespace": "src", "targetNamespaces": ["a", "b"]},
}
SOURCE = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "src"},
          "data": {"k": "v"}}


@pytest.fixture
def logs():
    """The host's log lines, as (level, message)."""
    lines = []
    log.set_sink(lambda level, message: lines.append((level, message)))
    yield lines
    log.set_sink(None)


@pytest.fixture
def load(monkeypatch, logs):
    """``hook.load`` with the root logger as in a fresh process (pytest's own handlers on it
    would make the hooks' ``logging.basicConfig`` do nothing)."""

    def load(name_or_path):
        monkeypatch.setattr(logging.root, "handlers", [])
        monkeypatch.setattr(logging.root, "level", logging.WARNING)
        path = name_or_path if isinstance(name_or_path, Path) else HOOKS / f"{name_or_path}.py"
        return hook.load(path)

    return load


def sync_request(parent=PARENT, related=None):
    return json.dumps({
        "controller": {}, "parent": parent, "children": {"ConfigMap.v1": {}},
        "related": {"ConfigMap.v1": {"src/settings": SOURCE} if related is None else related},
        "finalizing": False,
    })


def test_one_handler_answers_sync_and_customize_by_path(load):
    server = load("configmaps")
    assert server.RequestHandlerClass.__name__ == "Controller"
    synced = server.post("/sync", sync_request())
    assert synced.ok and synced.status == 200
    document = json.loads(synced.body)
    assert document["status"] == {"copies": 2}
    assert [(c["metadata"]["namespace"], c["data"]) for c in document["children"]] == [("a", {"k": "v"}), ("b", {"k": "v"})]
    customized = server.post("/customize", json.dumps({"controller": {}, "parent": PARENT}))
    assert json.loads(customized.body) == {"relatedResources": [
        {"apiVersion": "v1", "resource": "configmaps", "namespace": "src", "names": ["settings"]}]}


def test_a_non_2xx_answer_is_an_error_with_its_status_and_body(load):
    server = load("configmaps")
    broken = server.post("/broken", sync_request())
    assert (broken.ok, broken.status, json.loads(broken.body)) == (False, 500, {"error": "the source is unreadable"})
    unknown = server.post("/finalize", sync_request())  # no branch: the handler's own 404
    assert (unknown.status, json.loads(unknown.body)) == (404, {"error": "404", "endpoint": "/finalize"})


def test_an_exception_is_a_500_with_its_type_and_where_and_the_traceback_logged(load, logs):
    server = load("configmaps")
    parent = {**PARENT, "spec": {"targetNamespaces": ["a"]}}
    failed = server.post("/sync", sync_request(parent))
    assert failed == hook.Answer(500, (
        "KeyError at configmaps.py:15 (its text is not shown, it may carry values: "
        "answer a non-2xx status with a body to say more)"
    ))
    errors = [m for level, m in logs if level is Level.ERROR]
    assert errors[0] == "Traceback (most recent call last):", errors
    assert any('configmaps.py", line 15, in sync' in m for m in errors), errors
    assert errors[-1].startswith("KeyError (its text is not shown"), errors
    assert not any("wasmop_sdk" in m for m in errors), errors  # from the server's frames on, as over HTTP


MARKER = "s3cr3t-Pa55w0rd"  # a Secret's value a hook formats into its exception


def test_an_exceptions_text_reaches_neither_the_answer_nor_the_log(tmp_path, load, logs):
    path = tmp_path / "leaky.py"
    path.write_text(
        "import json\n"
        "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
        "class Leaky(BaseHTTPRequestHandler):\n"
        "    def do_POST(self):\n"
        "        pw = json.loads(self.rfile.read(int(self.headers['Content-Length'])))['password']\n"
        "        try:\n"
        "            int(pw)\n"  # ValueError: invalid literal for int() with base 10: 'MARKER'
        "        except ValueError as e:\n"
        "            raise RuntimeError(f'bad password {pw}') from e\n"
        "HTTPServer(('', 80), Leaky).serve_forever()\n"
    )
    failed = load(path).post("/sync", json.dumps({"password": MARKER}))
    assert failed.status == 500
    assert MARKER not in failed.body, failed.body
    assert failed.body.startswith("RuntimeError at leaky.py:9 (its text is not shown"), failed.body
    assert logs and not any(MARKER in m for _, m in logs), logs
    errors = [m for level, m in logs if level is Level.ERROR]
    # The log keeps the frames of both exceptions and their types, without their text.
    assert 'leaky.py", line 7, in do_POST' in "\n".join(errors) and 'leaky.py", line 9, in do_POST' in "\n".join(errors), errors
    assert any(m.startswith("ValueError (its text is not shown") for m in errors), errors
    assert errors[-1].startswith("RuntimeError (its text is not shown"), errors


def test_sys_exit_in_a_handler_is_a_500_too_without_its_message(tmp_path, load, logs):
    path = tmp_path / "exits.py"
    path.write_text(
        "import http.server, sys\n"
        "class Exits(http.server.BaseHTTPRequestHandler):\n"
        "    def do_POST(self): sys.exit('token ' + self.rfile.read(int(self.headers['Content-Length'])).decode())\n"
        "http.server.HTTPServer(('', 80), Exits).serve_forever()\n"
    )
    answer = load(path).post("/sync", MARKER)
    assert answer.status == 500 and answer.body.startswith("SystemExit at exits.py:3 "), answer
    assert MARKER not in answer.body and logs and not any(MARKER in m for _, m in logs), logs


def test_logging_print_and_the_servers_lines_reach_the_hosts_log_at_their_levels(load, logs):
    server = load("configmaps")
    server.post("/sync", sync_request(related={}))
    assert (Level.INFO, "INFO:__main__:sync p") in logs
    assert (Level.DEBUG, "DEBUG:__main__:children: {'ConfigMap.v1': {}}") in logs
    assert (Level.WARN, "WARNING:__main__:source settings is gone") in logs
    assert (Level.INFO, "copies wanted: 2") in logs
    access = [(level, m) for level, m in logs if '"POST /sync HTTP/1.1" 200' in m]
    assert [level for level, _ in access] == [Level.DEBUG] and access[0][1].startswith("wasmop - - ["), access
    logs.clear()
    server.post("/broken", sync_request())
    assert (Level.ERROR, "ERROR:__main__:cannot sync p") in logs


def test_natively_the_default_log_goes_to_the_real_stderr(load, capfd):
    server = load("configmaps")
    log.set_sink(None)  # the SDK's default natively: stderr, which is the hook's during a call
    assert server.post("/sync", sync_request()).ok
    assert "INFO copies wanted: 2\n" in capfd.readouterr().err


def test_the_request_is_the_post_metacontroller_sends(load, logs):
    server = load("odd")
    echo = server.post("/echo", '{"parent": {}}')
    assert echo.status == 201
    assert json.loads(echo.body) == {
        "command": "POST", "path": "/echo", "version": "HTTP/1.1", "type": "application/json",
        "length": "14", "body": {"parent": {}}, "port": 8080,
    }
    assert any(m.endswith("] echo of 14 bytes") for level, m in logs if level is Level.INFO), logs


def test_serving_stops_the_file_as_it_would_never_return(load):
    server = load("odd")
    assert "AFTER_SERVING" not in server.RequestHandlerClass.do_POST.__globals__
    assert server.server_address == ("", 8080)


def test_log_lines_are_cut_and_counted(load, logs):
    server = load("odd")
    chatty = server.post("/chatty", "{}")
    assert chatty.status == 503 and "too chatty" in chatty.body
    assert len(logs) == hook.LOG_LINES_MAX + 1
    assert logs[0] == (Level.INFO, "x" * (hook.LOG_LINE_MAX - 3) + "...")
    assert logs[-2] == (Level.INFO, f"line {hook.LOG_LINES_MAX - 2}")
    assert logs[-1] == (Level.WARN, f"{700 - 499 + 2} more log lines dropped (at most 500 a call)")


def test_answers_that_are_not_a_response_document_are_500s(load):
    server = load("odd")
    assert server.post("/big", "{}") == hook.Answer(500, f"the hook answered more than {hook.OUTPUT_MAX} bytes")
    assert server.post("/nothing", "{}") == hook.Answer(500, "the hook answered nothing (no send_response)")
    headless = server.post("/headless", "{}")
    assert headless.status == 500 and "no status line" in headless.body
    assert server.post("/latin", "{}") == hook.Answer(500, "the hook answered a body that is not UTF-8")
    assert server.post("/two words", "{}").status == 400


def test_a_handler_without_do_post_gets_the_servers_501(tmp_path, load):
    path = tmp_path / "getter.py"
    path.write_text(
        "import http.server\n"
        "class Getter(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self): pass\n"
        "http.server.HTTPServer(('', 80), Getter).serve_forever()\n"
    )
    answer = load(path).post("/sync", "{}")
    assert answer.status == 501 and "Unsupported method ('POST')" in answer.body


def test_the_modules_beside_a_hook_file_are_imported(tmp_path, load):
    (tmp_path / "children.py").write_text("def of(parent):\n    return [{'kind': 'Pod', 'name': parent}]\n")
    path = tmp_path / "sync.py"
    path.write_text(
        "import json\n"
        "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
        "import children\n"
        "class Sync(BaseHTTPRequestHandler):\n"
        "    def do_POST(self):\n"
        "        self.send_response(200)\n"
        "        self.end_headers()\n"
        "        self.wfile.write(json.dumps(children.of('p')).encode())\n"
        "HTTPServer(('', 80), Sync).serve_forever()\n"
    )
    assert load(path).post("/sync", "{}") == hook.Answer(200, '[{"kind": "Pod", "name": "p"}]')


def test_a_file_that_makes_no_server_is_refused(tmp_path):
    path = tmp_path / "library.py"
    path.write_text("from http.server import BaseHTTPRequestHandler\nclass Handler(BaseHTTPRequestHandler): pass\n")
    with pytest.raises(Error, match=r"library.py made no HTTPServer\(address, Handler\)"):
        hook.load(path)


@pytest.fixture
def hook_world(tmp_path_factory):
    """componentize-py's bindings for the ``hook`` world, generated natively (plain Python)."""
    tool = shutil.which("componentize-py") or str(Path(sys.executable).parent / "componentize-py")
    out = tmp_path_factory.mktemp("hook-bindings")
    subprocess.run([tool, "-d", str(WIT), "-w", "hook", "bindings", str(out)], check=True)
    sys.path.insert(0, str(out))
    try:
        from componentize_py_types import Err
        from wit_world.exports import hooks

        yield hooks, Err
    finally:
        sys.path.remove(str(out))
        for name in [m for m in sys.modules if m.split(".")[0] in ("wit_world", "componentize_py_types")]:
            del sys.modules[name]


def test_the_exported_call_answers_ok_or_a_hook_error(load, logs, hook_world):
    hooks, Err = hook_world
    exported = hook.export(load("configmaps"))
    assert exported.__name__ == "Hooks"
    guest = exported()
    body = guest.call(hooks.HookRequest(kind=hooks.HookKind.SYNC, path="/sync", body=sync_request()))
    assert len(json.loads(body)["children"]) == 2
    with pytest.raises(Err) as failure:
        guest.call(hooks.HookRequest(kind=hooks.HookKind.FINALIZE, path="/finalize", body=sync_request()))
    assert failure.value.value == hooks.HookError(status=404, message='{"error": "404", "endpoint": "/finalize"}')
