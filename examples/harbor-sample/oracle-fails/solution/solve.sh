#!/bin/bash
set -euo pipefail
head -n 10 /app/numbers.txt | python3 -c 'import sys; print(sum(int(l) for l in sys.stdin))' > /app/sum.txt
