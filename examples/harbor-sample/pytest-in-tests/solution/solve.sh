#!/bin/bash
set -euo pipefail
cat > /app/textkit/core.py <<'EOF'
"""Small text helpers."""
import re
import unicodedata


def slugify(title: str) -> str:
    """A URL slug: lowercase ASCII letters and digits, words joined by single hyphens."""
    ascii_text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", ascii_text.lower()).strip("-")


def word_count(text: str) -> int:
    """Number of whitespace-separated words."""
    return len(text.split())
EOF
