import sys
want = 60
try:
    got = open("/app/sum.txt").read().strip()
except OSError as e:
    sys.exit(str(e))
sys.exit(0 if got == str(2 * want) else f"sum {got!r} is wrong")
