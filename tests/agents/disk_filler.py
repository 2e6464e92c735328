"""Fills the workspace and /tmp until something stops it; reports how far it got."""
import json
import os

out = {}
for where in ("/workspace", "/tmp"):
    written = 0
    try:
        for i in range(10_000):
            with open(os.path.join(where, f"fill-{i}"), "wb") as fh:
                for _ in range(64):
                    fh.write(b"\0" * (1 << 20))
                    written += 1 << 20
    except OSError as e:
        out[where] = f"stopped after {written >> 20} MiB: {type(e).__name__}"
    else:
        out[where] = f"NOT STOPPED after {written >> 20} MiB"
print(json.dumps(out))
