"""IndexedJob: a Job whose Pods each get an index, as a Metacontroller CompositeController hook.

An HTTP handler in Metacontroller's style: Metacontroller POSTs the sync request as JSON; `do_POST`
reads it from `self.rfile`, answers with send_response/send_header/end_headers and writes JSON to
`self.wfile`. The same file runs as a webhook (python hook.py) and as a wasmop hook module. There is
one hook (sync), so every path is the sync hook, as upstream.

Behaviour (Metacontroller's examples/indexedjob):
- Pods `<job>-<index>` for index 0..completions-1 (`spec.completions`, default 1), each from
  `spec.template` with `JOB_INDEX=<index>` appended to every container's env.
- At most `spec.parallelism` (default 1) Pods that have not finished at a time; a new index is
  started only when fewer are active. A Pod that finished (Succeeded or Failed) is kept and its
  index is never run again.
- Status: `active`, `succeeded`, `failed` (Pods observed by phase) and the condition
  `Complete` = "True" once `succeeded` equals `completions`, else "False".
- Once the job's own status says Complete (or Failed) = True, it is frozen: the status is kept as
  it is and the observed Pods are kept, nothing new is started.
"""

import copy
import json
import re
from http.server import BaseHTTPRequestHandler, HTTPServer

INDEXED = re.compile(r'^(.*)-(\d+)$')


def index_of(job_name, pod_name):
    """`<job>-<n>` -> n; any other name -> -1."""
    match = INDEXED.match(pod_name or '')
    if match is None or match.group(1) != job_name:
        return -1
    return int(match.group(2))


def finished(job):
    for condition in (job.get('status') or {}).get('conditions') or []:
        if condition.get('type') in ('Complete', 'Failed') and condition.get('status') == 'True':
            return True
    return False


def pod_for(job, index):
    pod = copy.deepcopy(job['spec']['template'])
    pod['apiVersion'] = 'v1'
    pod['kind'] = 'Pod'
    pod.setdefault('metadata', {})['name'] = '%s-%d' % (job['metadata']['name'], index)
    for container in pod['spec']['containers']:
        container['env'] = list(container.get('env') or []) + [{'name': 'JOB_INDEX', 'value': str(index)}]
    return pod


def sync(request):
    job = request['parent']
    name = job['metadata']['name']

    # The job's Pods by index, counted by phase.
    observed = {}
    active = succeeded = failed = 0
    for key, pod in (request.get('children', {}).get('Pod.v1') or {}).items():
        index = index_of(name, pod.get('metadata', {}).get('name', key))
        if index < 0:
            continue
        observed[index] = pod
        phase = (pod.get('status') or {}).get('phase')
        if phase == 'Succeeded':
            succeeded += 1
        elif phase == 'Failed':
            failed += 1
        else:
            active += 1

    if finished(job):
        # Done once: keep the status and the Pods that are left, start nothing.
        return {'status': job['status'], 'children': [pod_for(job, i) for i in observed]}

    completions = job['spec'].get('completions', 1)
    parallelism = job['spec'].get('parallelism', 1)
    status = {
        'active': active,
        'succeeded': succeeded,
        'failed': failed,
        'conditions': [{'type': 'Complete', 'status': str(succeeded == completions)}],
    }

    wanted = {index: pod_for(job, index) for index in observed}
    for index in range(completions):
        if active >= parallelism:
            break
        if index not in wanted:
            wanted[index] = pod_for(job, index)
            active += 1
    return {'status': status, 'children': list(wanted.values())}


class Controller(BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get('content-length') or 0)
        body = self.rfile.read(length)
        try:
            answer = sync(json.loads(body))
        except Exception as err:  # a malformed request: say so rather than drop the connection
            self.reply(500, ('%s: %s' % (type(err).__name__, err)).encode('utf-8'), 'text/plain')
            return
        self.reply(200, json.dumps(answer).encode('utf-8'), 'application/json')

    def reply(self, code, payload, content_type):
        self.send_response(code)
        self.send_header('Content-Type', content_type)
        self.send_header('Content-Length', str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


HTTPServer(('', 80), Controller).serve_forever()
