import sys
sys.path.insert(0, "/app")
from durations import parse_duration
cases = {"1h30m": 5400, "45s": 45, "2h5s": 7205, "0s": 0, "10m10m": 1200}
for text, want in cases.items():
    if parse_duration(text) != want:
        sys.exit(f"{text!r} wrong")
for bad in ["", "5", "1d", "h", "1h 2m", "3x"]:
    try:
        parse_duration(bad)
    except ValueError:
        continue
    sys.exit(f"{bad!r} accepted")
