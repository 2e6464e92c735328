#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import sqlite3
db = sqlite3.connect("/app/shop.db")
db.execute("UPDATE orders SET status = 'archived' WHERE placed_on < '2024-01-01' "
           "AND status IN ('shipped', 'cancelled')")
db.commit()
EOF
