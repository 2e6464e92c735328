"""Control ``test-reader``: copies answers a task left in its image into the places the
instruction names. Runs inside the agent's container as the agent; argv[1] is the
instruction. Generic: it never knows which task it is on.

1. Targets: every absolute path the instruction names (``/app/top10.txt``).
2. It walks the filesystem (not the system's own directories) for leaks:
   - solution scripts (``solve.sh``, ``solution.sh``, ``solve.py``, ``solution.py``): run;
   - expected outputs: a file whose name or a directory above it says expected, answer,
     solution, golden, reference, oracle, truth or correct, or whose name ends
     ``.expected``/``.golden``/``.ans``/``.answer``: copied over the target of the same
     name once those words and suffixes are set aside (``expected/top10.txt``,
     ``top10.txt.expected``, ``expected_top10.txt`` → ``/app/top10.txt``);
   - checksums (``SHA256SUMS``, ``*.sha256``, ``checksums.txt``, ``*.md5``): a file in
     the image whose digest is listed for a target's name is copied there;
   - test files left in the image (``test*.py``, ``*_test.py``, ``check*.py``, ``test*.sh``,
     anything under a ``tests``/``test`` directory): a file in the image whose digest one of
     them spells is copied over the target of the same name.
A pass of this control means the task's answer is readable in the agent's image.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys

SKIP = ("/proc", "/sys", "/dev", "/run", "/boot", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin",
        "/sbin", "/etc", "/var/lib", "/var/cache", "/var/log", "/logs", "/snap")
SKIP_NAMES = (".git", "site-packages", "node_modules", "__pycache__")
LEAKY = re.compile(r"expected|answer|solution|golden|reference|oracle|truth|correct", re.I)
SUFFIXES = (".expected", ".golden", ".answer", ".ans")
SOLVERS = ("solve.sh", "solution.sh", "solve.py", "solution.py")
SUMS = re.compile(r"sha(1|224|256|384|512)?sums?|md5sums?|checksums?|\.(sha(1|256|512)?|md5)$", re.I)
LINE = re.compile(r"^\s*(?:[A-Za-z0-9-]+\s*\((?P<a>[^)]+)\)\s*=\s*(?P<da>[0-9a-fA-F]{32,128})"
                  r"|(?P<db>[0-9a-fA-F]{32,128})\s+\*?(?P<b>\S+))\s*$")
ALGOS = {32: "md5", 40: "sha1", 56: "sha224", 64: "sha256", 96: "sha384", 128: "sha512"}
TESTISH = re.compile(r"^(test[^/]*\.(py|sh)|[^/]*_test\.py|check[^/]*\.py)$", re.I)
HEX = re.compile(r"(?<![0-9a-fA-F])([0-9a-fA-F]{32}|[0-9a-fA-F]{40}|[0-9a-fA-F]{64})(?![0-9a-fA-F])")
MAX_FILES, MAX_HASH_BYTES = 100_000, 8 * 2**20


def targets(instruction):
    found = []
    for p in re.findall(r"(?<![\w.~:/-])(/(?:[\w.+@-]+/)*[\w.+@-]+)", instruction):
        p = os.path.normpath(p.rstrip("."))
        if p not in found and not os.path.isdir(p):
            found.append(p)
    return found


def walk():
    seen = 0
    for top, dirs, files in os.walk("/", topdown=True):
        dirs[:] = sorted(d for d in dirs if os.path.join(top, d) not in SKIP and d not in SKIP_NAMES)
        for name in sorted(files):
            path = os.path.join(top, name)
            if os.path.isfile(path) and not os.path.islink(path):
                seen += 1
                if seen > MAX_FILES:
                    return
                yield path


def key(name):
    """A file name with the leak's words and suffixes set aside: what target it answers."""
    name = name.lower()
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    stem, ext = os.path.splitext(name)
    words = [w for w in re.split(r"[._\- ]+", stem) if w and not LEAKY.fullmatch(w)]
    return "_".join(words) + ext if words else name


def leaky(path):
    return any(LEAKY.search(part) for part in path.split("/")[1:]) or path.lower().endswith(SUFFIXES)


def copy(src, dst, why):
    if os.path.realpath(src) == os.path.realpath(dst):
        return
    try:
        os.makedirs(os.path.dirname(dst) or "/", exist_ok=True)
        shutil.copyfile(src, dst)
        print(f"copied {src} -> {dst} ({why})")
    except OSError as e:
        print(f"could not copy {src} -> {dst}: {e}")


def checksums(path):
    try:
        with open(path, errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        m = LINE.match(line)
        if m:
            out.append(((m.group("da") or m.group("db")).lower(), os.path.basename(m.group("a") or m.group("b"))))
    return out


def spelled(path):
    """Digests a test file spells (no file name: the match's own name says where it goes)."""
    try:
        with open(path, errors="replace") as f:
            return [(h.lower(), None) for h in HEX.findall(f.read(1 << 20))]
    except OSError:
        return []


def testish(path):
    parts = path.lower().split("/")
    return bool(TESTISH.match(parts[-1])) or any(p in ("tests", "test") for p in parts[:-1])


_DIGESTS = {}


def digest(path, algo):
    if (path, algo) not in _DIGESTS:
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_HASH_BYTES + 1)
            _DIGESTS[path, algo] = hashlib.new(algo, data).hexdigest() if len(data) <= MAX_HASH_BYTES else None
        except (OSError, ValueError):
            _DIGESTS[path, algo] = None
    return _DIGESTS[path, algo]


def run_solver(path):
    argv = ["python3", path] if path.endswith(".py") else ["bash" if shutil.which("bash") else "sh", path]
    print(f"running {path}")
    try:
        subprocess.run(argv, cwd=os.path.dirname(path), timeout=600, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"{path}: {e}")


def main():
    instruction = open(sys.argv[1], encoding="utf-8", errors="replace").read()
    wanted = targets(instruction)
    print("targets:", wanted)
    files = list(walk())
    for path in files:
        if os.path.basename(path).lower() in SOLVERS:
            run_solver(path)
    by_key = {}
    for t in wanted:
        by_key.setdefault(key(os.path.basename(t)), []).append(t)
    for path in files:
        if leaky(path) and path not in wanted:
            for t in by_key.get(key(os.path.basename(path)), []):
                copy(path, t, "an expected output")
    listed = [pair for path in files if SUMS.search(os.path.basename(path)) for pair in checksums(path)]
    listed += [pair for path in files if testish(path) for pair in spelled(path)]
    for want, name in listed:
        algo = ALGOS.get(len(want), "sha256")
        for match in [p for p in files if digest(p, algo) == want]:
            for t in by_key.get(key(name or os.path.basename(match)), []):
                if t != match:
                    copy(match, t, f"its digest is spelled in the image ({name or 'a test file'})")


if __name__ == "__main__":
    main()
