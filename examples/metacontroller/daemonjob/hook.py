"""DaemonJob: run a Pod's containers once on every node, as a Metacontroller CompositeController
hook.

An HTTP handler in Metacontroller's style: Metacontroller POSTs the sync request as JSON; `do_POST`
reads it from `self.rfile`, answers with send_response/send_header/end_headers and writes JSON to
`self.wfile`. The same file runs as a webhook (python hook.py) and as a wasmop hook module. There is
one hook (sync), so every path is the sync hook, as upstream.

Behaviour (Metacontroller's examples/daemonjob, the "single-use DaemonSet" pattern):
- The child is a DaemonSet `<job>-dj` whose Pods run the job's containers as *init* containers
  (one after the other) and then a pause container (`spec.pauseImage`, default
  gcr.io/google_containers/pause, 10m CPU): a Pod is Ready once all the job's containers have
  run. Its labels and selector are the template's labels.
- The job's status is the DaemonSet's status plus the condition `Complete`: "True" once every
  scheduled Pod is Ready (`desiredNumberScheduled` = `numberReady` > 0), else "False".
- Once the job's own status says so, the status is frozen (with Complete "True") and the
  DaemonSet is deleted: completion is recorded before the child goes away.
"""

import copy
import json
from http.server import BaseHTTPRequestHandler, HTTPServer

DEFAULT_PAUSE_IMAGE = 'gcr.io/google_containers/pause'


def all_ready(obj):
    """Whether a DaemonSet status (or a DaemonJob status copied from one) says every Pod is Ready."""
    if 'status' not in obj:
        return False
    status = obj['status'] or {}
    scheduled = status.get('desiredNumberScheduled', 1)
    return scheduled > 0 and status.get('numberReady', 0) == scheduled


def daemonset_for(job):
    template = copy.deepcopy(job['spec']['template'])
    labels = template['metadata']['labels']
    template['spec']['initContainers'] = template['spec']['containers']
    template['spec']['containers'] = [{
        'name': 'pause',
        'image': job['spec'].get('pauseImage', DEFAULT_PAUSE_IMAGE),
        'resources': {'requests': {'cpu': '10m'}},
    }]
    return {
        'apiVersion': 'apps/v1',
        'kind': 'DaemonSet',
        'metadata': {'name': '%s-dj' % job['metadata']['name'], 'labels': copy.deepcopy(labels)},
        'spec': {
            'selector': {'matchLabels': copy.deepcopy(labels)},
            'template': template,
        },
    }


def sync(request):
    job = request['parent']

    if all_ready(job):
        # Finished before: keep the status, mark it Complete, and let the DaemonSet go.
        status = copy.deepcopy(job['status'])
        status['conditions'] = [{'type': 'Complete', 'status': 'True'}]
        return {'status': status, 'children': []}

    daemonsets = request.get('children', {}).get('DaemonSet.apps/v1') or {}
    observed = daemonsets.get('%s-dj' % job['metadata']['name'], {})
    status = copy.deepcopy(observed.get('status') or {})
    status['conditions'] = [{'type': 'Complete', 'status': 'True' if all_ready(observed) else 'False'}]
    # The DaemonSet stays until the status above, once written, says Complete.
    return {'status': status, 'children': [daemonset_for(job)]}


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
