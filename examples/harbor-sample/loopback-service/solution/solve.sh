#!/bin/bash
set -euo pipefail
cat > /app/kv.py <<'EOF'
"""A tiny key-value store over HTTP: PUT, GET (and soon DELETE) /kv/<key>."""
import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STORE = {}


class Handler(BaseHTTPRequestHandler):
    def _key(self):
        return self.path[len("/kv/"):] if self.path.startswith("/kv/") else None

    def _send(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self):
        key = self._key()
        if not key:
            return self._send(400)
        length = int(self.headers.get("Content-Length", "0"))
        STORE[key] = self.rfile.read(length)
        self._send(201)

    def do_GET(self):
        key = self._key()
        if not key:
            return self._send(400)
        if key not in STORE:
            return self._send(404)
        self._send(200, STORE[key])

    def do_DELETE(self):
        key = self._key()
        if not key:
            return self._send(400)
        if STORE.pop(key, None) is None:
            return self._send(404)
        self._send(204)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args()
    ThreadingHTTPServer(("127.0.0.1", args.port), Handler).serve_forever()
EOF
