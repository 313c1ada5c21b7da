"""Unit tests of hook.py without Wasm and without a server.

hook.py is loaded with http.server.HTTPServer replaced, so its last line builds a fake server
instead of listening on port 80; each test then drives Controller.do_POST as the HTTP server would:
a request body in `rfile`, headers in `headers`, the path, and reads the HTTP response written to
`wfile`. The requests are those Metacontroller sends (hook version v1: children under `Pod.v1`,
keyed by name).

    python3 -m pytest examples/metacontroller/indexedjob
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
    spec = importlib.util.spec_from_file_location('indexedjob_hook', HOOK)
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


def job(completions=10, parallelism=2, status=None):
    """The IndexedJob of example.yaml, as the API server returns it."""
    j = {
        'apiVersion': 'ctl.enisoc.com/v1', 'kind': 'IndexedJob',
        'metadata': {'name': 'print-index', 'namespace': 'default', 'uid': 'ij-1', 'generation': 1},
        'spec': {
            'template': {
                'metadata': {'labels': {'app': 'print-index'}},
                'spec': {
                    'restartPolicy': 'OnFailure',
                    'containers': [{'name': 'print-index', 'image': 'busybox', 'command': ['sh', '-c', 'echo ${JOB_INDEX}']}],
                },
            },
        },
    }
    if completions is not None:
        j['spec']['completions'] = completions
    if parallelism is not None:
        j['spec']['parallelism'] = parallelism
    if status is not None:
        j['status'] = status
    return j


def pod(name, phase='Running'):
    p = {'apiVersion': 'v1', 'kind': 'Pod',
         'metadata': {'name': name, 'namespace': 'default', 'labels': {'app': 'print-index', 'controller-uid': 'ij-1'}},
         'spec': {'containers': [{'name': 'print-index', 'image': 'busybox'}]}}
    if phase is not None:
        p['status'] = {'phase': phase}
    return p


def sync(hook, parent, pods=(), path='/sync'):
    request = {
        'controller': {'kind': 'CompositeController', 'metadata': {'name': 'indexedjob-controller'}},
        'parent': parent,
        'children': {'Pod.v1': {p['metadata']['name']: p for p in pods}},
        'related': {},
        'finalizing': False,
    }
    response = post(hook, path, request)
    assert response.code == 200, response.body
    return response.json()


def names(desired):
    return sorted(p['metadata']['name'] for p in desired['children'])


def job_index(p):
    [container] = p['spec']['containers']
    return [e['value'] for e in container['env'] if e['name'] == 'JOB_INDEX']


def test_a_new_job_starts_as_many_pods_as_parallelism(hook):
    desired = sync(hook, job())
    assert desired['status'] == {'active': 0, 'succeeded': 0, 'failed': 0,
                                 'conditions': [{'type': 'Complete', 'status': 'False'}]}
    assert names(desired) == ['print-index-0', 'print-index-1']
    first = next(p for p in desired['children'] if p['metadata']['name'] == 'print-index-0')
    assert first == {
        'apiVersion': 'v1', 'kind': 'Pod',
        'metadata': {'name': 'print-index-0', 'labels': {'app': 'print-index'}},
        'spec': {'restartPolicy': 'OnFailure', 'containers': [{
            'name': 'print-index', 'image': 'busybox', 'command': ['sh', '-c', 'echo ${JOB_INDEX}'],
            'env': [{'name': 'JOB_INDEX', 'value': '0'}],
        }]},
    }


def test_no_new_pod_while_parallelism_pods_are_active(hook):
    for phase in ('Running', 'Pending', None):
        desired = sync(hook, job(), [pod('print-index-0', phase), pod('print-index-1', phase)])
        assert names(desired) == ['print-index-0', 'print-index-1'], phase
        assert desired['status']['active'] == 2, phase


def test_a_finished_pod_makes_room_for_the_next_index(hook):
    desired = sync(hook, job(), [pod('print-index-0', 'Succeeded'), pod('print-index-1')])
    assert names(desired) == ['print-index-0', 'print-index-1', 'print-index-2']
    assert desired['status'] == {'active': 1, 'succeeded': 1, 'failed': 0,
                                 'conditions': [{'type': 'Complete', 'status': 'False'}]}
    assert [job_index(p) for p in desired['children'] if p['metadata']['name'] == 'print-index-2'] == [['2']]


def test_failed_pods_are_counted_and_their_index_not_run_again(hook):
    desired = sync(hook, job(), [pod('print-index-0', 'Failed'), pod('print-index-1', 'Succeeded')])
    assert names(desired) == ['print-index-0', 'print-index-1', 'print-index-2', 'print-index-3']
    assert desired['status']['failed'] == 1
    assert desired['status']['succeeded'] == 1
    assert desired['status']['active'] == 0  # as observed, before the new Pods


def test_the_lowest_missing_indexes_come_first(hook):
    pods = [pod('print-index-%d' % i, 'Succeeded') for i in (0, 1, 3)]
    desired = sync(hook, job(), pods)
    assert names(desired) == ['print-index-0', 'print-index-1', 'print-index-2', 'print-index-3', 'print-index-4']


def test_complete_once_every_index_succeeded(hook):
    almost = [pod('print-index-%d' % i, 'Succeeded') for i in range(9)] + [pod('print-index-9')]
    assert sync(hook, job(), almost)['status']['conditions'] == [{'type': 'Complete', 'status': 'False'}]
    pods = [pod('print-index-%d' % i, 'Succeeded') for i in range(10)]
    desired = sync(hook, job(), pods)
    assert desired['status'] == {'active': 0, 'succeeded': 10, 'failed': 0,
                                 'conditions': [{'type': 'Complete', 'status': 'True'}]}
    assert names(desired) == sorted('print-index-%d' % i for i in range(10))


def test_a_finished_job_is_frozen(hook):
    frozen = {'active': 0, 'succeeded': 10, 'failed': 0, 'observedGeneration': 1,
              'conditions': [{'type': 'Complete', 'status': 'True'}]}
    # Pod garbage collection took some Pods: nothing is started again, the status stays.
    desired = sync(hook, job(status=frozen), [pod('print-index-9', 'Succeeded')])
    assert desired['status'] == frozen
    assert names(desired) == ['print-index-9']
    assert job_index(desired['children'][0]) == ['9']
    failed = {'conditions': [{'type': 'Failed', 'status': 'True'}]}
    assert sync(hook, job(status=failed))['children'] == []
    # A Complete condition that is not True does not freeze it.
    running = {'conditions': [{'type': 'Complete', 'status': 'False'}]}
    assert names(sync(hook, job(status=running))) == ['print-index-0', 'print-index-1']


def test_completions_and_parallelism_default_to_one(hook):
    desired = sync(hook, job(completions=None, parallelism=None))
    assert names(desired) == ['print-index-0']
    done = sync(hook, job(completions=None, parallelism=None), [pod('print-index-0', 'Succeeded')])
    assert done['status']['conditions'] == [{'type': 'Complete', 'status': 'True'}]
    assert names(done) == ['print-index-0']


def test_job_index_is_appended_to_every_container_once(hook):
    parent = job()
    parent['spec']['template']['spec']['containers'] = [
        {'name': 'a', 'image': 'busybox', 'env': [{'name': 'MODE', 'value': 'x'}]},
        {'name': 'b', 'image': 'busybox'},
    ]
    desired = sync(hook, parent)
    for p in desired['children']:
        index = p['metadata']['name'].rsplit('-', 1)[1]
        a, b = p['spec']['containers']
        assert a['env'] == [{'name': 'MODE', 'value': 'x'}, {'name': 'JOB_INDEX', 'value': index}]
        assert b['env'] == [{'name': 'JOB_INDEX', 'value': index}]


def test_pods_of_other_names_are_ignored(hook):
    desired = sync(hook, job(), [pod('print-index-x'), pod('other-0'), pod('print-index')])
    assert names(desired) == ['print-index-0', 'print-index-1']
    assert desired['status']['active'] == 0


def test_every_path_is_the_sync_hook_and_a_bad_request_is_a_500(hook):
    assert names(sync(hook, job(), path='/')) == ['print-index-0', 'print-index-1']
    response = post(hook, '/sync', b'{"children": {}}')
    assert response.code == 500
    assert b'parent' in response.body
