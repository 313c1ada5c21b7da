"""service-per-pod: a Service for each Pod of a StatefulSet, and each Pod labelled with its own
name, as two Metacontroller DecoratorController hooks served by one handler.

An HTTP handler in Metacontroller's style: Metacontroller POSTs JSON to the paths of the
controllers' webhook URLs; `do_POST` reads it from `self.rfile`, answers with
send_response/send_header/end_headers and writes JSON to `self.wfile`. The same file runs as a
webhook (python hook.py) and as a wasmop hook module.

Behaviour (Metacontroller's examples/service-per-pod, whose hooks are jsonnet):
- /sync-service-per-pod: for a StatefulSet annotated `service-per-pod-label: <key>` and
  `service-per-pod-ports: "<port>:<targetPort>,..."`, one Service per replica, `<name>-<index>`,
  selecting the Pods whose label `<key>` is `<name>-<index>`.
- /finalize-service-per-pod: no attachments, and finalized once no Service is observed (the
  StatefulSet was deleted, or opted out by losing an annotation).
- /sync-pod-name-label: for a Pod annotated `pod-name-label: <key>`, the label `<key>: <pod name>`.
- Any other path: 404 with a JSON error; a request the hook cannot read: 500 with the error.
"""

import json
from http.server import BaseHTTPRequestHandler, HTTPServer


def ports(spec):
    """`"80:80,8080:8080"` as Service ports."""
    out = []
    for pair in spec.split(','):
        port, target = pair.split(':')
        out.append({'name': 'port-%d' % int(port), 'port': int(port), 'targetPort': int(target)})
    return out


def sync_service_per_pod(request):
    statefulset = request['object']
    annotations = statefulset['metadata']['annotations']
    label = annotations['service-per-pod-label']
    name = statefulset['metadata']['name']
    return {'attachments': [{
        'apiVersion': 'v1',
        'kind': 'Service',
        'metadata': {'name': '%s-%d' % (name, index), 'labels': {'app': 'service-per-pod'}},
        'spec': {
            'selector': {label: '%s-%d' % (name, index)},
            'ports': ports(annotations['service-per-pod-ports']),
        },
    } for index in range(statefulset['spec'].get('replicas', 1))]}


def finalize_service_per_pod(request):
    # Clean up every Service; done once none is observed.
    return {
        'attachments': [],
        'finalized': len(request['attachments'].get('Service.v1', {})) == 0,
    }


def sync_pod_name_label(request):
    pod = request['object']
    key = pod['metadata']['annotations']['pod-name-label']
    return {'labels': {key: pod['metadata']['name']}}


HOOKS = {
    '/sync-service-per-pod': sync_service_per_pod,
    '/finalize-service-per-pod': finalize_service_per_pod,
    '/sync-pod-name-label': sync_pod_name_label,
}


class Controller(BaseHTTPRequestHandler):
    def do_POST(self):
        hook = HOOKS.get(self.path)
        length = int(self.headers.get('content-length') or 0)
        body = self.rfile.read(length)
        if hook is None:
            self.reply(404, {'error': '404', 'endpoint': self.path})
            return
        try:
            answer = hook(json.loads(body))
        except Exception as err:  # a malformed request: say so rather than drop the connection
            self.reply(500, '%s: %s' % (type(err).__name__, err), 'text/plain')
            return
        self.reply(200, answer)

    def reply(self, code, document, content_type='application/json'):
        if content_type == 'application/json':
            payload = json.dumps(document).encode('utf-8')
        else:
            payload = str(document).encode('utf-8')
        self.send_response(code)
        self.send_header('Content-Type', content_type)
        self.send_header('Content-Length', str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


HTTPServer(('', 80), Controller).serve_forever()
