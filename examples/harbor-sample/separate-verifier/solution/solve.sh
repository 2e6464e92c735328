#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
from fractions import Fraction
m = [[Fraction(int(x)) for x in line.split()] for line in open("/app/matrix.txt") if line.strip()]
n, det = len(m), Fraction(1)
for c in range(n):
    p = next((r for r in range(c, n) if m[r][c] != 0), None)
    if p is None:
        det = Fraction(0)
        break
    if p != c:
        m[c], m[p] = m[p], m[c]
        det = -det
    det *= m[c][c]
    for r in range(c + 1, n):
        f = m[r][c] / m[c][c]
        m[r] = [a - f * b for a, b in zip(m[r], m[c])]
open("/logs/artifacts/determinant.txt", "w").write(f"{int(det)}\n")
EOF
