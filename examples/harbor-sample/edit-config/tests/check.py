"""The whole file must equal the original with exactly the two settings changed."""
import sys
WANT = '# service configuration (edit with care)\n[server]\nhost = 0.0.0.0\nport = 9090\nworkers = 4\n\n[logging]\nlevel = debug\npath = /var/log/app.log\n'
try:
    got = open("/app/server.conf", encoding="utf-8").read()
except OSError as e:
    sys.exit(f"cannot read /app/server.conf: {e}")
if got != WANT:
    sys.exit("server.conf differs from the expected file")
print("ok")
