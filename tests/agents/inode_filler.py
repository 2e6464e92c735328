"""Creates empty files in /workspace and /tmp until something stops it. Prints one JSON object:
the files created and what stopped it."""
import json
import os

created = 0
stopped = "NOT STOPPED"
try:
    for i in range(1_000_000):
        os.close(os.open(os.path.join(("/workspace", "/tmp")[i % 2], f"f{i}"), os.O_CREAT | os.O_WRONLY,
                         0o600))
        created += 1
except OSError as e:
    stopped = f"{type(e).__name__}: {os.strerror(e.errno) if e.errno else e}"
print(json.dumps({"files": created, "stopped": stopped}))
