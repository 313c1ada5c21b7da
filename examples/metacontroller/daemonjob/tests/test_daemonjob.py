"""Unit tests of hook.py without Wasm and without a server.

hook.py is loaded with http.server.HTTPServer replaced, so its last line builds a fake server
instead of listening on port 80; each test then drives Controller.do_POST as the HTTP server would:
a request body in `rfile`, headers in `headers`, the path, and reads the HTTP response written to
`wfile`. The requests are those Metacontroller sends (hook version v1: children under
`DaemonSet.apps/v1`, keyed by name).

    python3 -m pytest examples/metacontroller/daemonjob
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
    spec = importlib.util.spec_from_file_location('daemonjob_hook', HOOK)
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


CONTAINER = {'name': 'hello-world', 'image': 'busybox', 'command': ['sh', '-c', "echo 'Hello world' && sleep 30"],
             'resources': {'requests': {'cpu': '10m'}}}


def job(status=None, **spec):
    """The DaemonJob of example.yaml, as the API server returns it."""
    j = {
        'apiVersion': 'ctl.example.com/v1', 'kind': 'DaemonJob',
        'metadata': {'name': 'hello-world', 'namespace': 'default', 'uid': 'dj-1', 'generation': 1},
        'spec': dict({'template': {
            'metadata': {'labels': {'app': 'hello-world'}},
            'spec': {'terminationGracePeriodSeconds': 10, 'containers': [dict(CONTAINER)]},
        }}, **spec),
    }
    if status is not None:
        j['status'] = status
    return j


def daemonset(scheduled, ready, **extra):
    return {
        'apiVersion': 'apps/v1', 'kind': 'DaemonSet',
        'metadata': {'name': 'hello-world-dj', 'namespace': 'default', 'labels': {'app': 'hello-world', 'controller-uid': 'dj-1'}},
        'spec': {'selector': {'matchLabels': {'app': 'hello-world'}}, 'template': {}},
        'status': dict({'currentNumberScheduled': scheduled, 'desiredNumberScheduled': scheduled,
                        'numberMisscheduled': 0, 'numberReady': ready, 'observedGeneration': 1}, **extra),
    }


def sync(hook, parent, daemonsets=(), path='/sync'):
    request = {
        'controller': {'kind': 'CompositeController', 'metadata': {'name': 'daemonjob-controller'}},
        'parent': parent,
        'children': {'DaemonSet.apps/v1': {d['metadata']['name']: d for d in daemonsets}},
        'related': {},
        'finalizing': False,
    }
    response = post(hook, path, request)
    assert response.code == 200, response.body
    return response.json()


EXPECTED_DAEMONSET = {
    'apiVersion': 'apps/v1',
    'kind': 'DaemonSet',
    'metadata': {'name': 'hello-world-dj', 'labels': {'app': 'hello-world'}},
    'spec': {
        'selector': {'matchLabels': {'app': 'hello-world'}},
        'template': {
            'metadata': {'labels': {'app': 'hello-world'}},
            'spec': {
                'terminationGracePeriodSeconds': 10,
                'initContainers': [CONTAINER],
                'containers': [{'name': 'pause', 'image': 'gcr.io/google_containers/pause',
                                'resources': {'requests': {'cpu': '10m'}}}],
            },
        },
    },
}

NOT_COMPLETE = [{'type': 'Complete', 'status': 'False'}]
COMPLETE = [{'type': 'Complete', 'status': 'True'}]


def test_a_new_job_gets_its_daemonset(hook):
    desired = sync(hook, job())
    assert desired == {'status': {'conditions': NOT_COMPLETE}, 'children': [EXPECTED_DAEMONSET]}


def test_the_status_is_the_daemonsets_while_pods_are_not_all_ready(hook):
    for scheduled, ready in ((2, 0), (2, 1), (0, 0)):
        ds = daemonset(scheduled, ready)
        desired = sync(hook, job(), [ds])
        assert desired['status'] == dict(ds['status'], conditions=NOT_COMPLETE), (scheduled, ready)
        assert desired['children'] == [EXPECTED_DAEMONSET]


def test_all_pods_ready_reports_complete_but_keeps_the_daemonset(hook):
    ds = daemonset(2, 2, numberAvailable=2)
    desired = sync(hook, job(), [ds])
    assert desired['status'] == dict(ds['status'], conditions=COMPLETE)
    assert desired['children'] == [EXPECTED_DAEMONSET]


def test_once_the_job_status_says_so_the_daemonset_goes_and_the_status_stays(hook):
    recorded = dict(daemonset(2, 2)['status'], conditions=COMPLETE)
    # Whatever the DaemonSet says now (it may be going away), the recorded status wins.
    for observed in ([], [daemonset(2, 2)], [daemonset(2, 0)]):
        desired = sync(hook, job(status=recorded), observed)
        assert desired == {'status': recorded, 'children': []}, observed
    # A status without the condition yet: it is added.
    bare = daemonset(3, 3)['status']
    assert sync(hook, job(status=bare))['status'] == dict(bare, conditions=COMPLETE)


def test_a_job_status_that_is_not_finished_keeps_the_daemonset(hook):
    for status in ({'desiredNumberScheduled': 2, 'numberReady': 1, 'conditions': NOT_COMPLETE},
                   {'desiredNumberScheduled': 0, 'numberReady': 0},
                   {'conditions': NOT_COMPLETE}):
        desired = sync(hook, job(status=status), [daemonset(2, 1)])
        assert desired['children'] == [EXPECTED_DAEMONSET], status
    # As upstream: an absent desiredNumberScheduled counts as 1.
    assert sync(hook, job(status={'numberReady': 1}))['children'] == []


def test_pause_image_can_be_chosen(hook):
    desired = sync(hook, job(pauseImage='registry.k8s.io/pause:3.10'))
    [ds] = desired['children']
    assert ds['spec']['template']['spec']['containers'][0]['image'] == 'registry.k8s.io/pause:3.10'


def test_the_job_containers_become_init_containers_in_order(hook):
    parent = job()
    second = {'name': 'second', 'image': 'busybox'}
    parent['spec']['template']['spec']['containers'].append(second)
    parent['spec']['template']['spec']['initContainers'] = [{'name': 'dropped', 'image': 'busybox'}]
    [ds] = sync(hook, parent)['children']
    assert ds['spec']['template']['spec']['initContainers'] == [CONTAINER, second]
    assert [c['name'] for c in ds['spec']['template']['spec']['containers']] == ['pause']


def test_the_daemonset_carries_nothing_of_the_jobs_status(hook):
    [ds] = sync(hook, job(status={'desiredNumberScheduled': 2, 'numberReady': 1}))['children']
    assert ds == EXPECTED_DAEMONSET


def test_every_path_is_the_sync_hook_and_a_bad_request_is_a_500(hook):
    assert sync(hook, job(), path='/')['children'] == [EXPECTED_DAEMONSET]
    response = post(hook, '/sync', b'{"children": {}}')
    assert response.code == 500
    assert b'parent' in response.body
