"""A sample Metacontroller hook in the style of its Python examples, for the adapter's tests:
one http.server handler serves the sync and customize hooks of a controller that copies a
ConfigMap into namespaces. Not a wasmop module of its own: the adapter runs it unchanged."""

from http.server import BaseHTTPRequestHandler, HTTPServer
import json
import logging

logging.basicConfig(level=logging.DEBUG)
LOGGER = logging.getLogger(__name__)


class Controller(BaseHTTPRequestHandler):
    def sync(self, parent, related):
        name = parent['spec']['sourceName']
        source = related['ConfigMap.v1'].get(f"{parent['spec']['sourceNamespace']}/{name}")
        if source is None:
            LOGGER.warning("source %s is gone", name)
            return []
        return [{'apiVersion': 'v1', 'kind': 'ConfigMap',
                 'metadata': {'name': name, 'namespace': namespace},
                 'data': source.get('data', {})}
                for namespace in parent['spec']['targetNamespaces']]

    def customize(self, parent):
        return [{'apiVersion': 'v1', 'resource': 'configmaps',
                 'namespace': parent['spec']['sourceNamespace'],
                 'names': [parent['spec']['sourceName']]}]

    def answer(self, status, document):
        self.send_response(status)
        self.send_header('Content-type', 'application/json')
        self.end_headers()
        self.wfile.write(json.dumps(document).encode('utf-8'))

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get('content-length'))))
        parent = request['parent']
        if self.path == '/sync':
            LOGGER.info("sync %s", parent['metadata']['name'])
            LOGGER.debug("children: %s", request['children'])
            print('copies wanted:', len(parent['spec'].get('targetNamespaces', [])))
            children = self.sync(parent, request['related'])
            self.answer(200, {'status': {'copies': len(children)}, 'children': children})
        elif self.path == '/customize':
            LOGGER.info("customize %s", parent['metadata']['name'])
            self.answer(200, {'relatedResources': self.customize(parent)})
        elif self.path == '/broken':
            LOGGER.error("cannot sync %s", parent['metadata']['name'])
            self.answer(500, {'error': 'the source is unreadable'})
        else:
            self.answer(404, {'error': '404', 'endpoint': self.path})


HTTPServer(('', 80), Controller).serve_forever()
