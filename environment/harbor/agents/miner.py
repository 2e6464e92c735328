"""Control ``history-miner``: restores files from a git repository's history. Runs inside
the agent's container as the agent; argv[1] is the instruction. Generic: it never knows
which task it is on, and it needs no ``git`` (the object store is read with zlib: loose
objects and pack files, deltas included).

Repositories: a ``.git`` (directory, or a file saying ``gitdir:``) at or above the working
directory or a directory the instruction names, or up to three levels below the working
directory. Every commit in the object store counts — any branch or tag, the stash, the
reflog, a dangling commit — and for every path any of them holds, the largest version
(an implementation is longer than the stub that replaced it) is written over the working
tree's file when that is smaller, or written when the file is missing.
A pass of this control means the task's answer is in the image's repository history.
"""

import hashlib
import os
import re
import sys
import zlib

TYPES = {1: "commit", 2: "tree", 3: "blob", 4: "tag"}
MAX_PACK_BYTES = 256 * 2**20


def gitdir_of(path):
    dot = os.path.join(path, ".git")
    if os.path.isdir(os.path.join(dot, "objects")):
        return dot
    if os.path.isfile(dot):
        with open(dot, errors="replace") as f:
            line = f.read(4096).strip()
        if line.startswith("gitdir:"):
            d = os.path.join(path, line[7:].strip())
            return d if os.path.isdir(os.path.join(d, "objects")) else None
    return None


def repos(starts):
    found = {}
    for start in starts:
        d = os.path.abspath(start)
        while True:
            g = gitdir_of(d) if os.path.isdir(d) else None
            if g:
                found.setdefault(d, g)
            if d == "/":
                break
            d = os.path.dirname(d)
    for top, dirs, _ in os.walk(os.getcwd()):
        if top.count("/") - os.getcwd().count("/") >= 3:
            dirs[:] = []
        dirs[:] = [x for x in dirs if x != ".git"]
        g = gitdir_of(top)
        if g:
            found.setdefault(top, g)
    return sorted(found.items())


def varint(data, i):
    value = shift = 0
    while True:
        c = data[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return value, i


def apply_delta(base, delta):
    _, i = varint(delta, 0)
    _, i = varint(delta, i)
    out = bytearray()
    while i < len(delta):
        op = delta[i]
        i += 1
        if op & 0x80:
            off = size = 0
            for k in range(4):
                if op & (1 << k):
                    off |= delta[i] << (8 * k)
                    i += 1
            for k in range(3):
                if op & (0x10 << k):
                    size |= delta[i] << (8 * k)
                    i += 1
            out += base[off: off + (size or 0x10000)]
        elif op:
            out += delta[i: i + op]
            i += op
    return bytes(out)


def inflate(view, pos, size):
    d = zlib.decompressobj()
    out, fed = [], 0
    chunk = max(size + 64, 4096)
    while not d.eof and pos + fed < len(view):
        piece = view[pos + fed: pos + fed + chunk]
        fed += len(piece)
        out.append(d.decompress(piece))
    return b"".join(out), pos + fed - len(d.unused_data)


def read_pack(path, store):
    if os.path.getsize(path) > MAX_PACK_BYTES:
        return
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"PACK":
        return
    view, pos, by_offset, pending = memoryview(data), 12, {}, []
    for _ in range(int.from_bytes(data[8:12], "big")):
        start, c = pos, data[pos]
        kind, size, shift, pos = (c >> 4) & 7, c & 15, 4, pos + 1
        while c & 0x80:
            c, pos = data[pos], pos + 1
            size |= (c & 0x7F) << shift
            shift += 7
        base = None
        if kind == 6:
            c, pos = data[pos], pos + 1
            off = c & 0x7F
            while c & 0x80:
                c, pos = data[pos], pos + 1
                off = ((off + 1) << 7) | (c & 0x7F)
            base = ("ofs", start - off)
        elif kind == 7:
            base, pos = ("ref", data[pos: pos + 20].hex()), pos + 20
        body, pos = inflate(view, pos, size)
        pending.append((start, TYPES.get(kind), body, base))
    while pending:
        left = []
        for start, kind, body, base in pending:
            if base:
                got = by_offset.get(base[1]) if base[0] == "ofs" else store.get(base[1])
                if got is None:
                    left.append((start, kind, body, base))
                    continue
                kind, body = got[0], apply_delta(got[1], body)
            by_offset[start] = (kind, body)
            store[hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).hexdigest()] = (kind, body)
        if len(left) == len(pending):
            break
        pending = left


def load(gitdir):
    store, objects = {}, os.path.join(gitdir, "objects")
    for sub in sorted(os.listdir(objects)):
        d = os.path.join(objects, sub)
        if sub == "pack":
            for name in sorted(os.listdir(d)):
                if name.endswith(".pack"):
                    read_pack(os.path.join(d, name), store)
        elif len(sub) == 2 and os.path.isdir(d):
            for name in sorted(os.listdir(d)):
                try:
                    with open(os.path.join(d, name), "rb") as f:
                        raw = zlib.decompress(f.read())
                except (OSError, zlib.error):
                    continue
                head, _, body = raw.partition(b"\0")
                store[sub + name] = (head.split(b" ")[0].decode(), body)
    return store


def tree_files(store, sha, prefix, out):
    got = store.get(sha)
    if not got or got[0] != "tree":
        return
    body, i = got[1], 0
    while i < len(body):
        sp, nul = body.index(b" ", i), body.index(b"\0", i)
        mode, name, child = body[i:sp], body[sp + 1: nul].decode("utf-8", "replace"), body[nul + 1: nul + 21].hex()
        i = nul + 21
        path = f"{prefix}{name}"
        if mode.startswith(b"4"):
            tree_files(store, child, path + "/", out)
        elif mode.startswith(b"10") and child in store:
            out.setdefault(path, set()).add(child)


def restore(worktree, gitdir):
    store = load(gitdir)
    versions = {}
    for kind, body in list(store.values()):
        if kind == "commit":
            m = re.match(rb"tree ([0-9a-f]{40})", body)
            if m:
                tree_files(store, m.group(1).decode(), "", versions)
    for path, blobs in sorted(versions.items()):
        best = max(sorted(blobs), key=lambda b: len(store[b][1]))
        content, dest = store[best][1], os.path.join(worktree, path)
        if os.path.islink(dest) or os.path.isdir(dest) or ".." in path.split("/"):
            continue
        if os.path.isfile(dest) and os.path.getsize(dest) >= len(content):
            continue
        try:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(content)
            print(f"restored {dest} ({len(content)} bytes) from {gitdir}")
        except OSError as e:
            print(f"could not restore {dest}: {e}")


def main():
    text = open(sys.argv[1], encoding="utf-8", errors="replace").read() if len(sys.argv) > 1 else ""
    named = [p for p in re.findall(r"(?<![\w.~:/-])(/(?:[\w.+@-]+/)*[\w.+@-]+)", text)]
    starts = [os.getcwd()] + [p if os.path.isdir(p) else os.path.dirname(p) for p in named]
    for worktree, gitdir in repos(starts):
        print(f"repository {worktree} ({gitdir})")
        restore(worktree, gitdir)


if __name__ == "__main__":
    main()
