"""Unit tests of hook.py without Wasm and without a server.

hook.py is loaded with http.server.HTTPServer replaced, so its last line builds a fake server
instead of listening on port 80; each test then drives Controller.do_POST as the HTTP server would:
a request body in `rfile`, headers in `headers`, the path, and reads the HTTP response written to
`wfile`. The requests are those Metacontroller sends (hook version v1; the parent is
cluster-scoped, so namespaced objects are keyed `<namespace>/<name>`).

    python3 -m pytest examples/metacontroller/configmappropagation
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
    spec = importlib.util.spec_from_file_location('configmappropagation_hook', HOOK)
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


def parent(targets=('one', 'two', 'three')):
    """The managed ConfigMapPropagation of example.yaml, as the API server returns it."""
    return {
        'apiVersion': 'examples.metacontroller.io/v1alpha1',
        'kind': 'ConfigMapPropagation',
        'metadata': {'name': 'settings-propagation', 'labels': {'version': 'v1'}, 'uid': 'p-1', 'generation': 1},
        'spec': {'sourceName': 'settings', 'sourceNamespace': 'original', 'targetNamespaces': list(targets)},
    }


def configmap(namespace, data=None, **metadata):
    return {
        'apiVersion': 'v1', 'kind': 'ConfigMap',
        'metadata': dict({'name': 'settings', 'namespace': namespace, 'uid': 'cm-' + namespace, 'resourceVersion': '7'}, **metadata),
        'data': {'some': 'value', 'other': 'value'} if data is None else data,
    }


def sync_request(children=(), related=None, p=None):
    if related is None:
        related = {'ConfigMap.v1': {'original/settings': configmap('original', labels={'team': 'a'})}}
    return {
        'controller': {'kind': 'CompositeController', 'metadata': {'name': 'configmap-propagation-controller'}},
        'parent': p or parent(),
        'children': {'ConfigMap.v1': {'%s/settings' % c['metadata']['namespace']: c for c in children}},
        'related': related,
        'finalizing': False,
    }


def test_customize_asks_for_the_source_configmap_by_namespace_and_name(hook):
    response = post(hook, '/customize', {'controller': {}, 'parent': parent()})
    assert response.code == 200
    assert response.json() == {'relatedResources': [
        {'apiVersion': 'v1', 'resource': 'configmaps', 'namespace': 'original', 'names': ['settings']},
    ]}


def test_sync_copies_the_data_into_every_target_namespace(hook):
    response = post(hook, '/sync', sync_request())
    assert response.code == 200
    assert response.json() == {
        'status': {'expected_copies': 3, 'actual_copies': 0},
        'children': [
            {'apiVersion': 'v1', 'kind': 'ConfigMap', 'metadata': {'name': 'settings', 'namespace': ns},
             'data': {'some': 'value', 'other': 'value'}}
            for ns in ('one', 'two', 'three')
        ],
    }


def test_actual_copies_counts_the_observed_children(hook):
    observed = [configmap('one'), configmap('two')]
    desired = post(hook, '/sync', sync_request(children=observed)).json()
    assert desired['status'] == {'expected_copies': 3, 'actual_copies': 2}
    assert [c['metadata']['namespace'] for c in desired['children']] == ['one', 'two', 'three']


def test_a_changed_source_changes_every_copy(hook):
    related = {'ConfigMap.v1': {'original/settings': configmap('original', data={'some': 'new', 'empty': ''})}}
    desired = post(hook, '/sync', sync_request(children=[configmap('one')], related=related)).json()
    assert [c['data'] for c in desired['children']] == [{'some': 'new', 'empty': ''}] * 3


def test_target_namespaces_follow_the_spec(hook):
    desired = post(hook, '/sync', sync_request(p=parent(targets=['four']))).json()
    assert desired['status']['expected_copies'] == 1
    assert [c['metadata'] for c in desired['children']] == [{'name': 'settings', 'namespace': 'four'}]


def test_source_gone_deletes_the_copies(hook):
    observed = [configmap(ns) for ns in ('one', 'two', 'three')]
    for related in ({'ConfigMap.v1': {}}, {}):
        desired = post(hook, '/sync', sync_request(children=observed, related=related)).json()
        assert desired == {'status': {'expected_copies': 3, 'actual_copies': 3}, 'children': []}, related


def test_unknown_path_is_a_404(hook):
    response = post(hook, '/finalize', sync_request())
    assert response.code == 404
    assert response.json() == {'error': '404', 'endpoint': '/finalize'}


def test_a_request_without_a_parent_is_a_500(hook):
    response = post(hook, '/sync', {'children': {}})
    assert response.code == 500
    assert b'parent' in response.body
