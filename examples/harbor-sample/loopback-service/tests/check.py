"""Starts the service on a loopback port and talks HTTP to it."""
import http.client, socket, subprocess, sys, time

PORT = 18765
proc = subprocess.Popen([sys.executable, "/app/kv.py", "--port", str(PORT)])

def call(method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
    conn.request(method, path, body=body)
    resp = conn.getresponse()
    return resp.status, resp.read()

try:
    for _ in range(100):  # ready once the port accepts a connection
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    steps = [("PUT", "/kv/a", b"alpha", 201, None), ("GET", "/kv/a", None, 200, b"alpha"),
             ("GET", "/kv/missing", None, 404, None), ("DELETE", "/kv/a", None, 204, None),
             ("GET", "/kv/a", None, 404, None), ("DELETE", "/kv/a", None, 404, None),
             ("PUT", "/kv/b", "bêta".encode(), 201, None), ("GET", "/kv/b", None, 200, "bêta".encode())]
    for method, path, body, status, want in steps:
        try:
            got_status, got = call(method, path, body)
        except OSError as e:
            sys.exit(f"{method} {path}: {e}")
        if got_status != status or (want is not None and got != want):
            sys.exit(f"{method} {path}: got {got_status} {got[:40]!r}, want {status} {want!r}")
    print("ok")
finally:
    proc.kill()
    proc.wait()
