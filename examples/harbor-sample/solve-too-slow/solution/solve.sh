#!/bin/bash
set -euo pipefail
sleep 120  # "warming a cache"
python3 -c 'print(sum(int(l) for l in open("/app/numbers.txt") if l.strip()))' > /app/sum.txt
