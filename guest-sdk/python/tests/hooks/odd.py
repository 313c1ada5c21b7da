"""A sample hook for the adapter's tests that does what a hook may do and most do not: a guarded
ThreadingHTTPServer used as a context manager, the handler's own log_message, answers that
are too long, empty or not HTTP, and code after serve_forever that never runs over HTTP."""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def do_POST(self):
        body = self.rfile.read(int(self.headers['Content-Length']))
        if self.path == '/echo':
            self.log_message("echo of %d bytes", len(body))
            answer = json.dumps({
                'command': self.command, 'path': self.path, 'version': self.request_version,
                'type': self.headers.get('content-type'), 'length': self.headers.get('Content-Length'),
                'body': json.loads(body), 'port': self.server.server_port,
            }).encode('utf-8')
            self.send_response(201)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)
        elif self.path == '/chatty':
            sys.stderr.write('x' * 10000 + '\n')
            for i in range(700):
                print(f'line {i}')
            self.send_error(503, 'too chatty')
        elif self.path == '/big':
            self.send_response(200)
            self.end_headers()
            for _ in range(5):
                self.wfile.write(b' ' * (1 << 20))
        elif self.path == '/headless':
            self.wfile.write(b'{}')
        elif self.path == '/latin':
            self.send_response(200)
            self.end_headers()
            self.wfile.write('caf\u00e9'.encode('latin-1'))
        # any other path: nothing is answered


if __name__ == '__main__':
    with ThreadingHTTPServer(('', 8080), Handler) as server:
        server.serve_forever()
    AFTER_SERVING = True
