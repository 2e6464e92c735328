"""The bwrap profile's seccomp filter, built with libseccomp through ctypes.

Docker's default profile (moby ``profiles/seccomp/default.json``) is an allowlist; for a
container with every capability dropped it refuses, with EPERM, every system call outside
it. This filter allows by default and refuses that same set (`REFUSED`, read off the
profile on x86_64), with the same argument rules:

- ``clone`` with any namespace flag, ``unshare`` and ``setns`` (no nested user namespace: in
  one the agent would hold every capability again); ``clone3`` gets ENOSYS, so libc falls
  back to ``clone``, whose flags a filter can read;
- ``personality`` except the values docker allows (0, 8, 0x20000, 0x20008, 0xffffffff);
- ``socket(AF_VSOCK)``;
- ``io_uring_*`` (docker refuses them since 25.0: their rings bypass seccomp);
- and, beyond docker (which allows them on kernels ≥ 4.8), ``ptrace``,
  ``process_vm_readv`` and ``process_vm_writev``: agents never need them.

A system call of another ABI (i386 through ``int 0x80``, x32) kills the process: the
refusals are written for the native one. bwrap loads the filter (``--seccomp FD``) just
before it executes the sandbox's first program, so bwrap's own setup is not filtered. The
program's sha256 (`filter_sha256`) names it in the execution profile.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import hashlib
import os

from validate.core.errors import ProfileUnavailable

#: Refused with EPERM, whatever their arguments. (Names this libseccomp does not know are
#: refused by number if the kernel has them; none of these is new enough to matter.)
REFUSED: tuple[str, ...] = (
    "_sysctl", "acct", "add_key", "afs_syscall", "bpf", "chroot", "clock_settime", "create_module",
    "delete_module", "fanotify_init", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick",
    "get_kernel_syms", "get_mempolicy", "getpmsg", "init_module", "io_uring_enter", "io_uring_register",
    "io_uring_setup", "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load", "keyctl", "lookup_dcookie",
    "mbind", "migrate_pages", "mount", "mount_setattr", "move_mount", "move_pages", "nfsservctl",
    "open_by_handle_at", "open_tree", "perf_event_open", "pidfd_getfd", "pivot_root", "process_madvise",
    "process_vm_readv", "process_vm_writev", "ptrace", "putpmsg", "query_module", "quotactl", "quotactl_fd",
    "reboot", "request_key", "security", "set_mempolicy", "set_mempolicy_home_node", "setdomainname",
    "sethostname", "setns", "settimeofday", "swapoff", "swapon", "sysfs", "syslog", "tuxcall", "umount2",
    "unshare", "uselib", "userfaultfd", "ustat", "vhangup", "vserver",
)
#: CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
PERSONALITY_ALLOWED = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
AF_VSOCK = 40

_ACT_ALLOW, _ACT_KILL_PROCESS = 0x7FFF0000, 0x80000000
_FLTATR_ACT_BADARCH = 2
_CMP_GT, _CMP_MASKED_EQ = 6, 7
_LO32 = 0xFFFFFFFF


def _errno(code: int) -> int:
    return 0x00050000 | code


class _Cmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


@functools.cache
def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name)
    except OSError as e:
        raise ProfileUnavailable(f"backend bwrap: libseccomp is not installed ({e}); "
                                 f"apt-get install libseccomp2") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_Cmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def _personality_refusals() -> list[tuple[int, int, int]]:
    """(op, a, b) comparisons on arg 0, any one of which refuses: every value but
    `PERSONALITY_ALLOWED`. libseccomp takes one comparison per argument per rule, so
    "not one of five values" is spelt as single masked comparisons: the allowed values are
    those whose bits outside 0x20008 are all clear, plus all ones. A value with some such bit
    set and another clear has, along the cycle of those 30 bits, a set bit followed by a
    clear one; a value with all 30 set is refused unless bits 3 and 17 are set too."""
    free = 0x20008
    bits = [b for b in range(32) if not free >> b & 1]
    rules = [(_CMP_GT, _LO32, 0)]  # anything past 32 bits
    for b, nxt in zip(bits, bits[1:] + bits[:1], strict=True):
        rules.append((_CMP_MASKED_EQ, 1 << b | 1 << nxt, 1 << b))
    rules += [(_CMP_MASKED_EQ, 1 << bits[0] | f, 1 << bits[0]) for f in (0x8, 0x20000)]
    return rules


def _add(lib: ctypes.CDLL, ctx: int, action: int, name: str, comparisons: list[tuple[int, int, int]]) -> None:
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr == -1:  # __NR_SCMP_ERROR: unknown to this libseccomp
        return
    arr = (_Cmp * len(comparisons))(*[_Cmp(0, op, a, b) for op, a, b in comparisons])
    rc = lib.seccomp_rule_add_array(ctx, action, nr, len(comparisons), arr if comparisons else None)
    if rc != 0:
        raise ProfileUnavailable(f"backend bwrap: libseccomp refused the rule for {name}: {os.strerror(-rc)}")


@functools.cache
def filter_bpf() -> bytes:
    """The compiled BPF program (bytes, as bwrap's ``--seccomp`` reads it); built once."""
    lib = _lib()
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise ProfileUnavailable("backend bwrap: seccomp_init failed")
    try:
        rc = lib.seccomp_attr_set(ctx, _FLTATR_ACT_BADARCH, _ACT_KILL_PROCESS)
        if rc != 0:
            raise ProfileUnavailable("backend bwrap: libseccomp refused the bad-arch action: "
                                     f"{os.strerror(-rc)}")
        eperm = _errno(errno.EPERM)
        for name in REFUSED:
            _add(lib, ctx, eperm, name, [])
        for flag in CLONE_NAMESPACE_FLAGS:
            _add(lib, ctx, eperm, "clone", [(_CMP_MASKED_EQ, flag, flag)])
        _add(lib, ctx, _errno(errno.ENOSYS), "clone3", [])
        _add(lib, ctx, eperm, "socket", [(_CMP_MASKED_EQ, _LO32, AF_VSOCK)])
        for comparison in _personality_refusals():
            _add(lib, ctx, eperm, "personality", [comparison])
        fd = os.memfd_create("seccomp-export")
        try:
            rc = lib.seccomp_export_bpf(ctx, fd)
            if rc != 0:
                raise ProfileUnavailable(f"backend bwrap: seccomp_export_bpf failed: {os.strerror(-rc)}")
            os.lseek(fd, 0, os.SEEK_SET)
            return _read_all(fd)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def filter_sha256() -> str:
    """``sha256:<hex>`` of `filter_bpf`: the execution profile's name for this filter."""
    return "sha256:" + hashlib.sha256(filter_bpf()).hexdigest()


def filter_fd() -> int:
    """A fresh memfd holding the program at offset 0, close-on-exec (pass it with `pass_fds`);
    the caller closes it once bwrap has started."""
    fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, filter_bpf())
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
