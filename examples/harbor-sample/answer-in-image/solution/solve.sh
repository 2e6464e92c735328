#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import collections, re
c = collections.Counter(re.findall(r"[a-z]+", open("/app/book.txt").read().lower()))
top = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
open("/app/top10.txt", "w").write("".join(f"{w} {n}\n" for w, n in top))
EOF
