#!/bin/bash
set -euo pipefail
# fetch the shared checker (needs the network at verify time)
python3 - <<'EOF'
import urllib.request
data = urllib.request.urlopen("https://checker.example.com/v2/sum-checker.py", timeout=20).read()
open("/tmp/sum-checker.py", "wb").write(data)
EOF
if python3 /tmp/sum-checker.py /app/sum.txt; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
