#!/bin/bash
set -euo pipefail
cat > /app/roman.py <<'EOF'
"""Roman numerals, 1..3999."""

_PAIRS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
          (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def to_roman(n: int) -> str:
    if not isinstance(n, int) or not 1 <= n <= 3999:
        raise ValueError(n)
    out = []
    for value, letters in _PAIRS:
        while n >= value:
            out.append(letters)
            n -= value
    return "".join(out)


def from_roman(s: str) -> int:
    total, i = 0, 0
    for value, letters in _PAIRS:
        while s.startswith(letters, i):
            total += value
            i += len(letters)
    if i != len(s) or not s or to_roman(total) != s:
        raise ValueError(s)
    return total
EOF
