import json, sys
try:
    c = json.load(open("/app/config.json"))
except (OSError, ValueError) as e:
    sys.exit(str(e))
sys.exit(0 if c.get("debug") is False and c.get("workers") == 4 else "wrong config")
