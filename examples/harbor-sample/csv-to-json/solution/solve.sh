#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import csv, json
with open("/app/people.csv", newline="", encoding="utf-8") as f:
    rows = [{"name": r["name"], "age": int(r["age"]), "email": r["email"]} for r in csv.DictReader(f)]
with open("/app/people.json", "w", encoding="utf-8") as f:
    json.dump(rows, f, ensure_ascii=False, indent=2)
EOF
