#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import os
root = "/app/data"
rows = []
for d, _, names in os.walk(root):
    for n in names:
        p = os.path.join(d, n)
        with open(p, "rb") as f:
            rows.append((os.path.relpath(p, root), f.read().count(b"\n")))
with open("/app/inventory.tsv", "w", encoding="utf-8") as out:
    for rel, n in sorted(rows):
        out.write(f"{rel}\t{n}\n")
EOF
