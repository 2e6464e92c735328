"""Tries what a sandbox must refuse: a nested user namespace (the `unshare -U` program and the
raw system calls), mount, keyctl, ptrace, bpf, clone3, a non-default personality, a vsock, a
syscall of the i386 ABI. Prints one JSON object: probe -> "ok" or the errno name (or the
signal that killed the trying process)."""
import ctypes
import errno
import json
import mmap
import os
import subprocess

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def call(nr, *args):
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))


def in_child(fn):
    """Run fn in a forked child; its result, or the signal that killed it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, fn().encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 100).decode()
    _, status = os.waitpid(pid, 0)
    return out if os.WIFEXITED(status) else f"killed by signal {os.WTERMSIG(status)}"


def i386_getpid():
    """`mov eax, 20; int 0x80; ret`: getpid through the i386 ABI."""
    code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])
    buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    return str(ctypes.CFUNCTYPE(ctypes.c_int)(addr)())


out = {
    "unshare_user": call(272, 0x10000000),            # unshare(CLONE_NEWUSER)
    "clone_newuser": in_child(lambda: call(56, 0x10000000 | 17, 0, 0, 0, 0)),
    "mount": call(165, 0, 0, 0, 0, 0),
    "keyctl": call(250, 0, 0, 0, 0, 0),               # keyctl(KEYCTL_GET_KEYRING_ID, ...)
    "ptrace": call(101, 0x4206, os.getppid(), 0, 0),  # ptrace(PTRACE_SEIZE, parent)
    "bpf": call(321, 0, 0, 0),
    "clone3": call(435, 0, 0),
    "personality_no_aslr": call(135, 0x0040000),      # ADDR_NO_RANDOMIZE
    "personality_query": call(135, 0xFFFFFFFF),
    "socket_vsock": call(41, 40, 1, 0),
    "i386_abi": in_child(i386_getpid),
}
try:
    p = subprocess.run(["unshare", "-U", "true"], capture_output=True, text=True, timeout=10)
    out["unshare_program"] = f"exit {p.returncode}: {p.stderr.strip()}"
except OSError as e:
    out["unshare_program"] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
