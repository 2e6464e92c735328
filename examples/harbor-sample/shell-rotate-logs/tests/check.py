import os, subprocess, sys, tempfile

def run(files):
    with tempfile.TemporaryDirectory() as d:
        for name, text in files.items():
            open(os.path.join(d, name), "w").write(text)
        r = subprocess.run(["/app/rotate.sh", d], capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            sys.exit(f"rotate.sh exited {r.returncode}: {r.stderr[-200:]}")
        return {n: open(os.path.join(d, n)).read() for n in sorted(os.listdir(d))}

if not os.access("/app/rotate.sh", os.X_OK):
    sys.exit("/app/rotate.sh is missing or not executable")
cases = [
    ({"app.log": "new"}, {"app.log": "", "app.log.1": "new"}),
    ({"app.log": "c", "app.log.1": "b", "app.log.2": "a", "app.log.3": "old", "keep.txt": "k"},
     {"app.log": "", "app.log.1": "c", "app.log.2": "b", "app.log.3": "a", "keep.txt": "k"}),
    ({"app.log": "x", "app.log.2": "y"}, {"app.log": "", "app.log.1": "x", "app.log.3": "y"}),
    ({}, {"app.log": ""}),
]
for before, after in cases:
    got = run(before)
    if got != after:
        sys.exit(f"{before} -> {got}, want {after}")
print("ok")
