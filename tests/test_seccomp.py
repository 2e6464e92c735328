"""`validate.sandbox.seccomp`: the compiled program is checked instruction by instruction (a
classic-BPF interpreter run on every refused call and on ordinary ones), then for real inside
bwrap."""

from __future__ import annotations

import ctypes
import json
import struct
import subprocess
import sys
import uuid

import pytest

from tests.test_sandbox import run_json
from validate.sandbox import Limits, RunRequest
from validate.sandbox.seccomp import (
    CLONE_NAMESPACE_FLAGS,
    PERSONALITY_ALLOWED,
    REFUSED,
    filter_bpf,
    filter_sha256,
)

AUDIT_ARCH_X86_64, AUDIT_ARCH_I386 = 0xC000003E, 0x40000003
ALLOW, KILL_PROCESS = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | 1, 0x00050000 | 38

def nr(name: str) -> int:
    lib = ctypes.CDLL("libseccomp.so.2")
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    return lib.seccomp_syscall_resolve_name(name.encode())


def run_bpf(program: bytes, syscall: int, args: tuple[int, ...] = (), arch: int = AUDIT_ARCH_X86_64) -> int:
    """What the kernel's seccomp would return for this call: a classic-BPF interpreter over
    struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}."""
    data = struct.pack("<iIQ6Q", syscall, arch, 0, *(list(args) + [0] * 6)[:6])
    insns = [struct.unpack("<HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    a = x = 0
    mem = [0] * 16
    pc = 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        cls = code & 0x07
        if cls == 0x00:  # LD
            mode = code & 0xE0
            a = struct.unpack_from("<I", data, k)[0] if mode == 0x20 else mem[k] if mode == 0x60 else k
        elif cls == 0x01:  # LDX
            x = mem[k] if code & 0xE0 == 0x60 else k
        elif cls in (0x02, 0x03):  # ST, STX
            mem[k] = a if cls == 0x02 else x
        elif cls == 0x04:  # ALU
            operand = x if code & 0x08 else k
            op = code & 0xF0
            ops = {0x00: a + operand, 0x10: a - operand, 0x40: a | operand,
                   0x50: a & operand, 0x60: a << (operand & 31), 0x70: a >> (operand & 31)}
            a = ops[op] & 0xFFFFFFFF
        elif cls == 0x05:  # JMP
            op = code & 0xF0
            operand = x if code & 0x08 else k
            if op == 0x00:
                pc += k
                continue
            taken = {0x10: a == operand, 0x20: a > operand, 0x30: a >= operand, 0x40: bool(a & operand)}[op]
            pc += jt if taken else jf
        elif cls == 0x06:  # RET
            return a if code & 0x18 == 0x10 else k
        else:  # MISC: TAX / TXA
            a, x = (a, a) if code & 0xF8 == 0x00 else (x, x)


def test_the_program_is_built_deterministically_and_named_by_its_sha256():
    program = filter_bpf()
    assert len(program) % 8 == 0 and len(program) > 8 * len(REFUSED)
    other = subprocess.run([sys.executable, "-c", "from validate.sandbox.seccomp import filter_sha256; "
                            "print(filter_sha256())"], capture_output=True, text=True,
                           check=True).stdout.strip()
    assert filter_sha256() == other and other.startswith("sha256:") and len(other) == 71


def test_every_refused_call_is_known_to_libseccomp_and_refused_whatever_its_arguments():
    program = filter_bpf()
    for name in REFUSED:
        number = nr(name)
        assert number >= 0, f"libseccomp does not know {name}"
        for args in ((), (1, 2, 3), (2**64 - 1,) * 6):
            assert run_bpf(program, number, args) == EPERM, (name, args)


def test_ordinary_calls_are_allowed():
    program = filter_bpf()
    for name in ("read", "write", "openat", "close", "mmap", "mprotect", "execve", "exit_group", "wait4",
                 "rt_sigaction", "futex", "getdents64", "newfstatat", "pipe2", "kill", "prctl", "seccomp",
                 "fork"):
        assert run_bpf(program, nr(name), (3, 0, 0)) == ALLOW, name
    sigchld, thread = 17, 0x3D0F00  # fork's flags; pthread_create's CLONE_VM|FS|FILES|SIGHAND|THREAD|...
    assert run_bpf(program, nr("clone"), (sigchld,)) == ALLOW
    assert run_bpf(program, nr("clone"), (thread,)) == ALLOW
    assert run_bpf(program, nr("socket"), (1, 1, 0)) == ALLOW  # AF_UNIX


def test_namespaces_clone3_personality_and_vsock_follow_dockers_rules():
    program = filter_bpf()
    for flag in CLONE_NAMESPACE_FLAGS:
        assert run_bpf(program, nr("clone"), (flag | 17,)) == EPERM, hex(flag)
    assert run_bpf(program, nr("clone3"), (0, 88)) == ENOSYS
    for value in PERSONALITY_ALLOWED:
        assert run_bpf(program, nr("personality"), (value,)) == ALLOW, hex(value)
    refused = [1, 7, 9, 0x10, 0x40000, 0x0400000, 0x20009, 0xFFFFFFFE, 0x7FFFFFFF, 0xFFFDFFF7, 0xFFFFFFF7,
               0xFFFDFFFF, 0x80000000, 2**32, 2**32 + 8, 2**64 - 1]
    for value in refused + [1 << b for b in range(32) if 1 << b not in (0x8, 0x20000)]:
        assert run_bpf(program, nr("personality"), (value,)) == EPERM, hex(value)
    assert run_bpf(program, nr("socket"), (40, 1, 0)) == EPERM
    assert run_bpf(program, nr("socket"), (2**32 + 40, 1, 0)) == EPERM  # the kernel reads an int


def test_another_abi_kills():
    program = filter_bpf()
    assert run_bpf(program, 20, arch=AUDIT_ARCH_I386) == KILL_PROCESS  # i386 getpid through int 0x80
    assert run_bpf(program, 0x40000000 | nr("mount")) == KILL_PROCESS  # x32


@pytest.mark.bwrap
def test_inside_bwrap_escapes_are_refused_and_a_normal_program_works(sandboxes):
    sandbox = sandboxes("bwrap")
    assert sandbox.seccomp_sha256 == filter_sha256()
    out = run_json(sandbox, "escape_probe")
    for probe in ("unshare_user", "clone_newuser", "mount", "keyctl", "ptrace", "bpf"):
        assert out[probe] == "EPERM", (probe, out)
    assert out["unshare_program"] == "exit 1: unshare: unshare failed: Operation not permitted"
    normal = ("import json, subprocess, threading, tempfile\n"
              "t = threading.Thread(target=lambda: None); t.start(); t.join()\n"
              "with tempfile.TemporaryFile() as fh: fh.write(b'x')\n"
              "print(json.dumps(subprocess.run(['python3', '-c', 'print(6 * 7)'], capture_output=True, "
              "text=True).stdout.strip()))")
    result = sandbox.run(RunRequest(argv=("python3", "-c", normal),
                                    name=f"seccomp-normal-{uuid.uuid4().hex[:8]}", workdir="/",
                                    limits=Limits(timeout_s=30.0)))
    assert (result.exit_code, json.loads(result.stdout)) == (0, "42"), result.stderr
