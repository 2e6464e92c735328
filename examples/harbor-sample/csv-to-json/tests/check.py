import json, sys
WANT = [
    {"name": "Lovelace, Ada", "age": 36, "email": "ada@example.org"},
    {"name": "Émilie du Châtelet", "age": 42, "email": "emilie@example.org"},
    {"name": 'O\'Neil, "Cathy"', "age": 51, "email": "cathy@example.org"},
    {"name": "Srinivasa Ramanujan", "age": 32, "email": "srinivasa@example.org"},
]
try:
    got = json.load(open("/app/people.json", encoding="utf-8"))
except (OSError, ValueError) as e:
    sys.exit(f"people.json: {e}")
if got != WANT or any(type(r["age"]) is not int for r in got):
    sys.exit(f"people.json differs: {got!r}")
print("ok")
