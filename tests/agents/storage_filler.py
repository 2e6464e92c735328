"""Fills /workspace and /tmp with many files, each far under the per-file cap, until something
stops it. Prints one JSON object: MiB written, files, and what stopped it."""
import json
import os

chunk = b"\0" * (1 << 20)
written = files = 0
stopped = "NOT STOPPED"
try:
    for i in range(100_000):
        where = ("/workspace", "/tmp")[i % 2]
        with open(os.path.join(where, f"fill-{i}"), "wb") as fh:
            files += 1
            for _ in range(4):  # 4 MiB per file
                fh.write(chunk)
                fh.flush()
                written += len(chunk)
except OSError as e:
    stopped = f"{type(e).__name__}: {os.strerror(e.errno) if e.errno else e}"
print(json.dumps({"mib": written >> 20, "files": files, "stopped": stopped}))
