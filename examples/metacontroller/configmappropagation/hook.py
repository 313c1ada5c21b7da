"""ConfigMapPropagation: copy one ConfigMap into a list of namespaces, as a Metacontroller
CompositeController hook with a customize hook.

An HTTP handler in Metacontroller's style: Metacontroller POSTs JSON to /customize and /sync;
`do_POST` reads it from `self.rfile`, answers with send_response/send_header/end_headers and writes
JSON to `self.wfile`. The same file runs as a webhook (python hook.py) and as a wasmop hook module.

Behaviour (Metacontroller's examples/configmappropagation):
- /customize: the related object is the source ConfigMap, `spec.sourceName` in
  `spec.sourceNamespace`, selected by namespace and name (no label selector).
- /sync: one ConfigMap named like the source in each of `spec.targetNamespaces`, with the source's
  `data`. Once the source is gone (no related ConfigMap), no copies: they are deleted.
  Status: `expected_copies` (target namespaces) and `actual_copies` (copies observed).
- Any other path: 404 with a JSON error; a request the hook cannot read: 500 with the error.

The parent is cluster-scoped, so Metacontroller keys namespaced children and related objects by
`<namespace>/<name>`.
"""

import json
from http.server import BaseHTTPRequestHandler, HTTPServer


def related_resources(parent):
    spec = parent['spec']
    return [{
        'apiVersion': 'v1',
        'resource': 'configmaps',
        'namespace': spec['sourceNamespace'],
        'names': [spec['sourceName']],
    }]


def copies(parent, related):
    spec = parent['spec']
    source = related.get('ConfigMap.v1', {}).get(
        '%s/%s' % (spec['sourceNamespace'], spec['sourceName']))
    if source is None:
        # The source ConfigMap was deleted: take the copies away too.
        return []
    return [{
        'apiVersion': 'v1',
        'kind': 'ConfigMap',
        'metadata': {'name': spec['sourceName'], 'namespace': namespace},
        'data': source.get('data') or {},
    } for namespace in spec['targetNamespaces']]


def sync(request):
    parent = request['parent']
    observed = request.get('children', {}).get('ConfigMap.v1', {})
    return {
        'status': {
            'expected_copies': len(parent['spec']['targetNamespaces']),
            'actual_copies': len(observed),
        },
        'children': copies(parent, request.get('related') or {}),
    }


def customize(request):
    return {'relatedResources': related_resources(request['parent'])}


HOOKS = {'/sync': sync, '/customize': customize}


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
