"""OpenSSH signatures over a run's ``checksums`` (``ssh-keygen -Y sign`` / ``-Y verify``).

``checksums`` covers every other file of the run directory, so signing it signs the run.
The namespace is `NAMESPACE`; a reviewer verifies with an allowed-signers file
(``<identity> <public key>`` per line) and the signer's identity. A new evidence entry
rewrites ``checksums`` and removes the stale signature: sign again after it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from validate.core.errors import EvidenceError, ValidateError
from validate.core.paths import RunPaths

NAMESPACE = "validate-evidence"


def _ssh_keygen() -> str:
    tool = shutil.which("ssh-keygen")
    if tool is None:
        raise ValidateError("signing needs ssh-keygen (apt-get install openssh-client)")
    return tool


def sign(root: Path, key: Path) -> Path:
    paths = RunPaths(Path(root))
    if not paths.checksums.is_file():
        raise EvidenceError(f"{paths.checksums}: missing; only a finished run directory can be signed")
    if not Path(key).is_file():
        raise ValidateError(f"--key: {key}: no such private key file")
    tmp = paths.root / ".checksums"
    shutil.copyfile(paths.checksums, tmp)
    try:
        proc = subprocess.run([_ssh_keygen(), "-Y", "sign", "-f", str(key), "-n", NAMESPACE, str(tmp)],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise ValidateError(f"--key: ssh-keygen could not sign with {key}: {proc.stderr.strip()[-500:]}")
        Path(str(tmp) + ".sig").replace(paths.signature)
    finally:
        tmp.unlink(missing_ok=True)
        Path(str(tmp) + ".sig").unlink(missing_ok=True)
    return paths.signature


def verify_signature(paths: RunPaths, allowed_signers: Path, identity: str) -> str | None:
    """None when ``checksums.sig`` is a valid signature of ``checksums`` by `identity`; else the problem."""
    if not paths.signature.is_file():
        return f"{paths.signature}: missing (sign the run with `validate sign`)"
    if not Path(allowed_signers).is_file():
        return f"{allowed_signers}: no such allowed-signers file"
    with open(paths.checksums, "rb") as data:
        proc = subprocess.run([_ssh_keygen(), "-Y", "verify", "-f", str(allowed_signers), "-I", identity,
                               "-n", NAMESPACE, "-s", str(paths.signature)], stdin=data, capture_output=True,
                              text=True, timeout=60)
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip()[-300:]
        return f"{paths.signature}: does not verify for {identity}: {said}"
    return None
