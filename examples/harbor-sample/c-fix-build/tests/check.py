"""Runs the built program and a fresh build of the source on the same inputs."""
import os, subprocess, sys
CASES = [("3 1 2", "2.0"), ("4 1 3 2", "2.5"), ("7", "7.0"), ("-5 -1", "-3.0"),
         ("2147483647 -2147483648 0", "0.0"), ("2147483647 2147483646", "2147483646.5"),
         (" ".join(str((i * 7919) % 1000 - 500) for i in range(999)), None)]

def expected(text):
    xs = sorted(int(t) for t in text.split())
    n = len(xs)
    m = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    return f"{m:.1f}"

def run(binary):
    for stdin, want in CASES:
        want = want or expected(stdin)
        out = subprocess.run([binary], input=stdin, capture_output=True, text=True, timeout=10)
        if out.returncode != 0 or out.stdout.strip() != want:
            sys.exit(f"{binary} on {stdin[:40]!r}: got {out.stdout.strip()!r}, want {want!r}")

if not os.access("/app/median", os.X_OK):
    sys.exit("/app/median is not built")
run("/app/median")
subprocess.run(["gcc", "-O2", "-o", "/tmp/median-fresh", "/app/src/median.c"], check=True)
run("/tmp/median-fresh")
print("ok")
