"""Unit tests of hook.py without Wasm and without a server.

hook.py is loaded with http.server.HTTPServer replaced, so its last line builds a fake server
instead of listening on port 80; each test then drives Controller.do_POST as the HTTP server would:
a request body in `rfile`, headers in `headers`, the path, and reads the HTTP response written to
`wfile`. The requests are those Metacontroller sends a DecoratorController's hooks (hook version
v1: the target is `object`, its attachments keyed by name).

    python3 -m pytest examples/metacontroller/service-per-pod
"""

import http.client
import importlib.util
import io
import json
import pathlib
from unittest import mock

import pytest

HOOK = pathlib.Path(__file__).resolve().parent.parent / 'hook.py'


@pytest.fixture(scope='module')
def hook():
    spec = importlib.util.spec_from_file_location('service_per_pod_hook', HOOK)
    module = importlib.util.module_from_spec(spec)
    with mock.patch('http.server.HTTPServer') as server:
        spec.loader.exec_module(module)
    # The file ends by serving its handler on port 80, as upstream's hooks do.
    server.assert_called_once_with(('', 80), module.Controller)
    server.return_value.serve_forever.assert_called_once_with()
    return module


class Response:
    def __init__(self, raw):
        head, _, self.body = raw.partition(b'\r\n\r\n')
        lines = head.decode('iso-8859-1').split('\r\n')
        version, code, _ = lines[0].split(' ', 2)
        assert version in ('HTTP/1.0', 'HTTP/1.1')  # BaseHTTPRequestHandler.protocol_version
        self.code = int(code)
        self.headers = {k.strip().lower(): v.strip() for k, v in (line.split(':', 1) for line in lines[1:])}

    def json(self):
        assert self.headers['content-type'] == 'application/json'
        return json.loads(self.body)


def post(hook, path, document):
    """Runs the hook's do_POST for one request; returns its HTTP response."""
    body = document if isinstance(document, bytes) else json.dumps(document).encode('utf-8')
    handler = hook.Controller.__new__(hook.Controller)
    handler.rfile = io.BytesIO(body)
    handler.wfile = io.BytesIO()
    handler.headers = http.client.HTTPMessage()
    handler.headers['Content-Type'] = 'application/json'
    handler.headers['Content-Length'] = str(len(body))
    handler.command, handler.path, handler.request_version = 'POST', path, 'HTTP/1.1'
    handler.requestline = 'POST %s HTTP/1.1' % path
    handler.client_address = ('127.0.0.1', 40000)
    handler.server = None
    handler.do_POST()
    response = Response(handler.wfile.getvalue())
    if 'content-length' in response.headers:
        assert int(response.headers['content-length']) == len(response.body)
    return response


def statefulset(replicas=3, **annotations):
    """my-statefulset.yaml's StatefulSet, as the API server returns it."""
    return {
        'apiVersion': 'apps/v1', 'kind': 'StatefulSet',
        'metadata': {'name': 'nginx', 'namespace': 'default', 'uid': 's-1', 'annotations': dict({
            'service-per-pod-label': 'pod-name', 'service-per-pod-ports': '80:80,8080:8080'}, **annotations)},
        'spec': {'replicas': replicas, 'selector': {'matchLabels': {'app': 'nginx'}}},
    }


def request(target, attachments=None, finalizing=False):
    return {
        'controller': {'kind': 'DecoratorController', 'metadata': {'name': 'service-per-pod'}},
        'object': target,
        'attachments': attachments if attachments is not None else {'Service.v1': {}},
        'related': {},
        'finalizing': finalizing,
    }


def test_sync_attaches_a_service_per_pod_selecting_it_by_the_annotated_label(hook):
    response = post(hook, '/sync-service-per-pod', request(statefulset()))
    assert response.code == 200
    ports = [{'name': 'port-80', 'port': 80, 'targetPort': 80},
             {'name': 'port-8080', 'port': 8080, 'targetPort': 8080}]
    assert response.json() == {'attachments': [
        {'apiVersion': 'v1', 'kind': 'Service',
         'metadata': {'name': 'nginx-%d' % i, 'labels': {'app': 'service-per-pod'}},
         'spec': {'selector': {'pod-name': 'nginx-%d' % i}, 'ports': ports}}
        for i in range(3)
    ]}


def test_the_services_follow_the_replicas_and_the_annotations(hook):
    answer = post(hook, '/sync-service-per-pod',
                  request(statefulset(replicas=1, **{'service-per-pod-label': 'x', 'service-per-pod-ports': '9:90'}))).json()
    assert [(a['metadata']['name'], a['spec']) for a in answer['attachments']] == [
        ('nginx-0', {'selector': {'x': 'nginx-0'}, 'ports': [{'name': 'port-9', 'port': 9, 'targetPort': 90}]})]


def test_finalize_removes_every_service_and_is_done_once_none_is_left(hook):
    left = {'Service.v1': {'nginx-2': {'metadata': {'name': 'nginx-2'}}}}
    assert post(hook, '/finalize-service-per-pod', request(statefulset(), left, True)).json() == {
        'attachments': [], 'finalized': False}
    assert post(hook, '/finalize-service-per-pod', request(statefulset(), None, True)).json() == {
        'attachments': [], 'finalized': True}


def test_a_pod_is_labelled_with_its_name_under_the_annotated_key(hook):
    pod = {'apiVersion': 'v1', 'kind': 'Pod',
           'metadata': {'name': 'nginx-2', 'namespace': 'default', 'annotations': {'pod-name-label': 'pod-name'}}}
    response = post(hook, '/sync-pod-name-label', request(pod, {}))
    assert response.code == 200
    assert response.json() == {'labels': {'pod-name': 'nginx-2'}}


def test_unknown_path_is_a_404(hook):
    response = post(hook, '/sync', request(statefulset()))
    assert response.code == 404
    assert response.json() == {'error': '404', 'endpoint': '/sync'}


def test_a_statefulset_without_the_annotations_is_a_500(hook):
    target = statefulset()
    target['metadata']['annotations'] = {}
    response = post(hook, '/sync-service-per-pod', request(target))
    assert response.code == 500
    assert b'service-per-pod-label' in response.body
