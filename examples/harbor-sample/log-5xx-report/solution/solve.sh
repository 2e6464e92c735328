#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import collections, datetime, re
counts = collections.Counter()
for line in open("/app/access.log"):
    m = re.search(r'\[([^\]]+)\] "[^"]*" (\d{3}) ', line)
    if m and m.group(2).startswith("5"):
        t = datetime.datetime.strptime(m.group(1), "%d/%b/%Y:%H:%M:%S %z")
        counts[t.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H")] += 1
with open("/app/report.csv", "w") as f:
    f.write("hour,count\n")
    for hour in sorted(counts):
        f.write(f"{hour},{counts[hour]}\n")
EOF
