"""Rebuilds the original database from the same seed and compares every row."""
import os, sqlite3, sys, tempfile
sys.path.insert(0, "/tests")
from make_db import build

with tempfile.TemporaryDirectory() as tmp:
    original = os.path.join(tmp, "orig.db")
    build(original)
    want = sqlite3.connect(original).execute("SELECT * FROM orders ORDER BY id").fetchall()
want = [(i, c, day, "archived" if day < "2024-01-01" and s in ("shipped", "cancelled") else s, t)
        for i, c, day, s, t in want]
db = sqlite3.connect("file:/app/shop.db?mode=ro", uri=True)
tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
if tables != ["orders"]:
    sys.exit(f"tables changed: {tables}")
got = db.execute("SELECT * FROM orders ORDER BY id").fetchall()
if got != want:
    sys.exit("orders differ from the expected rows")
print("ok")
