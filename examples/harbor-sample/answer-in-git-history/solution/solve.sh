#!/bin/bash
set -euo pipefail
cat > /app/durations.py <<'EOF'
"""Parses durations like "1h30m", "45s", "2h5s" into seconds."""
import re

_PART = re.compile(r"(\d+)([hms])")


def parse_duration(text: str) -> int:
    if not text or _PART.sub("", text):
        raise ValueError(text)
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(int(n) * units[u] for n, u in _PART.findall(text))
EOF
