"""A throwaway virtual machine with a pure cgroup v2 hierarchy, for tests/test_cgroups.py.

On a host whose memory, pids and cpu controllers are bound to cgroup v1, a cgroup2 mount
offers none of them, so v2's limits cannot be exercised there. This VM boots Debian 12's own
kernel (the package `linux-image-amd64` depends on, fetched once with ``apt-get download``
into `KERNEL_CACHE`) under qemu's TCG (no KVM needed), from a small initramfs: busybox, the
kernel's virtio, 9p and overlay modules, an init script. The VM's root is this machine's
``/``, shared read-only over 9p, under a tmpfs overlay: the same paths, interpreter, venv,
bubblewrap and sandbox rootfs. Its ``/sys/fs/cgroup`` is cgroup2 with every controller of
the kernel; no init system runs: the init script runs one command and powers off. The
command's output and exit status come back on the second serial port.
"""

from __future__ import annotations

import gzip
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

KERNEL_CACHE = Path(os.environ.get("VALIDATE_VM_KERNEL_CACHE", "/var/cache/deshuffle-validate/vm-kernel"))
MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay")
_EXIT = re.compile(rb"^VM-EXIT (\d+)$", re.MULTILINE)

INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /modules); do insmod "/mods/$m.ko" || echo "insmod $m failed" > /dev/ttyS1; done
mkdir -p /lower /upper /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 host /lower
mount -t tmpfs tmpfs /upper && mkdir /upper/u /upper/w
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot
mount -t proc proc /newroot/proc; mount -t sysfs sys /newroot/sys; mount -t devtmpfs dev /newroot/dev
mount -t cgroup2 none /newroot/sys/fs/cgroup
mount -t tmpfs tmpfs /newroot/tmp; mount -t tmpfs tmpfs /newroot/run
i=0
for p in $(cat /keep); do
  i=$((i + 1)); mkdir -p "/newroot$p" "/upper/k$i/u" "/upper/k$i/w"
  mount -t overlay overlay -o "lowerdir=/lower$p,upperdir=/upper/k$i/u,workdir=/upper/k$i/w" "/newroot$p"
done
cp /bin/busybox /command /stage2 /newroot/run/
exec switch_root /newroot /run/busybox sh /run/stage2
"""
# Not a chroot: the kernel refuses a chrooted process a user namespace, which bwrap needs.
STAGE2 = """/bin/sh -c "$(cat /run/command)" > /dev/ttyS1 2>&1
echo "VM-EXIT $?" > /dev/ttyS1
/run/busybox poweroff -f
"""


class VMUnavailable(RuntimeError):
    """qemu, busybox or the kernel package is missing; the message says how to get it."""


def kernel_tree(cache: Path = KERNEL_CACHE) -> Path:
    """The unpacked Debian kernel package (boot/vmlinuz-*, lib/modules/), fetched if absent."""
    for tree in sorted(cache.glob("linux-image-*")):
        if list(tree.glob("boot/vmlinuz-*")):
            return tree
    deps = subprocess.run(["apt-cache", "depends", "linux-image-amd64"], capture_output=True, text=True,
                          check=False)
    found = re.search(r"Depends: (linux-image-\S+)", deps.stdout)
    if found is None:
        raise VMUnavailable("no kernel package: `apt-cache depends linux-image-amd64` said "
                            f"{deps.stderr.strip()!r}")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        got = subprocess.run(["apt-get", "download", found.group(1)], cwd=tmp, capture_output=True, text=True,
                             check=False)
        debs = list(Path(tmp).glob("*.deb"))
        if got.returncode != 0 or not debs:
            raise VMUnavailable(f"apt-get download {found.group(1)} failed: {got.stderr.strip()[-300:]}")
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), f"{tmp}/tree"], check=True)
        os.rename(f"{tmp}/tree", cache / found.group(1))
    return cache / found.group(1)


def _modules(tree: Path, wanted: tuple[str, ...]) -> list[Path]:
    """`wanted` and what they depend on (read from each module's own modinfo), deps first."""
    files = {p.name[:-3].replace("-", "_"): p for p in tree.glob("lib/modules/*/kernel/**/*.ko")}
    order: list[Path] = []

    def add(name: str) -> None:
        path = files.get(name)
        if path is None or path in order:
            return  # built into the kernel, or already listed
        deps = re.search(rb"depends=([^\0]*)\0", path.read_bytes())
        for dep in (deps.group(1).decode().split(",") if deps and deps.group(1) else []):
            add(dep.replace("-", "_"))
        order.append(path)

    for name in wanted:
        add(name)
    return order


def _newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A cpio archive in the kernel's newc format: (name, mode with its type bits, data)."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate([*entries, ("TRAILER!!!", 0, b"")], start=1):
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name) + 1, 0)
        out += b"070701" + b"".join(b"%08X" % f for f in fields) + name.encode() + b"\0"
        out += b"\0" * (-len(out) % 4) + data + b"\0" * (-len(data) % 4)
    return bytes(out)


def _initramfs(tree: Path, command: str, keep: tuple[str, ...]) -> bytes:
    busybox = shutil.which("busybox")
    if busybox is None or b"ld-linux" in Path(busybox).read_bytes()[:4096]:  # a dynamic one has no libc there
        raise VMUnavailable("a static busybox is needed for the VM's init: apt-get install busybox-static")
    mods = _modules(tree, MODULES)
    directory, file = 0o040755, 0o100644
    entries = [(d, directory, b"") for d in ("bin", "dev", "proc", "sys", "mods")]
    entries += [("bin/busybox", file | 0o111, Path(busybox).read_bytes()),
                ("init", file | 0o111, INIT.encode()), ("stage2", file, STAGE2.encode()),
                ("command", file, command.encode()),
                ("modules", file, " ".join(p.name[:-3] for p in mods).encode()),
                ("keep", file, " ".join(keep).encode())]
    entries += [(f"mods/{p.name}", file, p.read_bytes()) for p in mods]
    return gzip.compress(_newc(entries), compresslevel=1)


def run_in_vm(command: str, env: Mapping[str, str] | None = None, timeout_s: float = 1800.0,
              memory_mb: int = 2048, visible: tuple[Path, ...] = ()) -> tuple[int, str]:
    """Boot the VM, run `command` (sh) as root in it, with `env` exported (the command otherwise
    starts with an empty environment); return (its exit status, its output). A value of `env`
    that is a directory under /tmp or /run, which the VM covers with its own tmpfs, stays
    visible there: a fresh image store under /tmp is one. So does each directory of `visible`
    (a checkout under /tmp, the corpus beside it). Each is writable as the VM's root is (an
    overlay on the VM's tmpfs; no write reaches the host): the tests write into the checkout
    (conftest's entry-point dist-info), which a read-only bind refused."""
    env = dict(env or {})
    dirs = [*env.values(), *(str(Path(d).resolve()) for d in visible)]
    keep = tuple(sorted({v for v in dirs if v.startswith(("/tmp/", "/run/")) and Path(v).is_dir()}))
    if any(c.isspace() for p in keep for c in p):
        raise ValueError(f"a path with white space cannot be kept visible in the VM: {keep}")
    command = "".join(f"export {k}={shlex.quote(v)}; " for k, v in sorted(env.items())) + command
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise VMUnavailable("qemu is needed to boot a cgroup v2 kernel: apt-get install qemu-system-x86")
    tree = kernel_tree()
    with tempfile.TemporaryDirectory(prefix="cgroup2-vm-") as tmp:
        (Path(tmp) / "initrd.gz").write_bytes(_initramfs(tree, command, keep))
        out = Path(tmp) / "serial1"
        argv = [qemu, "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", str(min(os.cpu_count() or 1, 2)),
                "-m", str(memory_mb), "-display", "none", "-nic", "none", "-no-reboot",
                "-serial", "null", "-serial", f"file:{out}",
                "-kernel", str(next(tree.glob("boot/vmlinuz-*"))), "-initrd", f"{tmp}/initrd.gz",
                "-append", "console=ttyS0 quiet panic=-1",
                "-virtfs", "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap"]
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, check=False)
        text = (out.read_bytes() if out.exists() else b"").replace(b"\r\n", b"\n")  # the tty's ONLCR
    status = _EXIT.search(text)
    return (int(status.group(1)) if status else -1), text.decode(errors="replace")
