import sys
try:
    got = open("/logs/artifacts/determinant.txt").read().strip()
except OSError as e:
    sys.exit(f"determinant.txt: {e}")
if got != "339":
    sys.exit(f"determinant {got!r} is wrong")
print("ok")
