"""The host's trust store handed to task builds (a profile option, ``--build-trust-store``).

On a machine behind a TLS-intercepting proxy, a build's ``pip install`` fails: the image
trusts public CAs, not the proxy's. With the option on, every build gets this machine's CA
bundle: the file is added to the build context (``TRUST_FILE``, kept by a ``.dockerignore``
negation when the task has one) and, after every ``FROM``, copied to `TRUST_PATH` and named
by build arguments (`TRUST_VARIABLES`: pip, requests, OpenSSL, curl, git, node, cargo read
them). A build argument is in the environment of the stage's ``RUN`` steps only, never in the
image's configuration, so the agent and verifier run as without it; the one file stays in the
image. The Dockerfile's change is part of the task's recorded patch, and the policy records
the bundle's sha256 (`BuildPolicy.trust_store`): a rebuild elsewhere must find a bundle with
that digest, or say so.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from environment.protocol import sha256_tag
from validate.core.errors import ProfileUnavailable
from validate.taskdir.images.dockerfile import external_images, ignore_also

TRUST_FILE = ".validate-build-trust.pem"
TRUST_PATH = "/etc/ssl/validate-build-trust.pem"
TRUST_VARIABLES = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
                   "NODE_EXTRA_CA_CERTS", "CARGO_HTTP_CAINFO")


def host_bundle() -> Path:
    """This machine's CA bundle: ``SSL_CERT_FILE`` when set, else OpenSSL's default file."""
    paths = ssl.get_default_verify_paths()
    for candidate in (os.environ.get("SSL_CERT_FILE"), paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise ProfileUnavailable(
        "--build-trust-store host: this machine has no CA bundle file (SSL_CERT_FILE, or "
        f"OpenSSL's {paths.openssl_cafile}); give the bundle's path instead"
    )


def bundle_for(option: str) -> Path | None:
    """The bundle `option` names: ``off`` (None) or ``host`` (this machine's)."""
    if option == "off":
        return None
    if option != "host":
        raise ProfileUnavailable(
            f"--build-trust-store: {option!r}; give off or host (this machine's CA bundle)"
        )
    path = host_bundle()
    if b"-----BEGIN CERTIFICATE-----" not in path.read_bytes():
        raise ProfileUnavailable(f"--build-trust-store host: {path} holds no PEM certificate")
    return path


def bundle_digest(path: Path | None) -> str | None:
    return None if path is None else sha256_tag(path.read_bytes())


def held_bundle(digest: str | None) -> bytes | None:
    """The bundle a policy froze, from this machine (None when the policy has none); a
    `ProfileUnavailable` when this machine's bundle is another."""
    if digest is None:
        return None
    data = host_bundle().read_bytes()
    if sha256_tag(data) != digest:
        raise ProfileUnavailable(
            f"build trust store: the contract's builds trusted the CA bundle {digest}; this "
            f"machine's ({host_bundle()}) is {sha256_tag(data)}"
        )
    return data


def is_host_bundle(bundle: bytes | None) -> bool:
    """Whether a build was given exactly what this machine trusts."""
    try:
        return bundle is not None and bundle == host_bundle().read_bytes()
    except (ProfileUnavailable, OSError):
        return False


def trust_lines() -> list[str]:
    """The lines that copy the bundle in and name it by build arguments."""
    return [f"COPY {TRUST_FILE} {TRUST_PATH}\n", *(f"ARG {v}={TRUST_PATH}\n" for v in TRUST_VARIABLES)]


def clock_lines(epoch: int) -> list[str]:
    """Build arguments that fix the clock of the tools that read one (dpkg-deb, tar, gzip and
    the other reproducible-builds tools: ``SOURCE_DATE_EPOCH``; git: its author and committer
    dates), so what they write does not depend on when the task was built."""
    date = f"@{epoch} +0000"
    return [
        f"ARG SOURCE_DATE_EPOCH={epoch}\n",
        f'ARG GIT_AUTHOR_DATE="{date}"\n',
        f'ARG GIT_COMMITTER_DATE="{date}"\n',
    ]


def after_every_from(text: str, added: list[str]) -> str:
    """The Dockerfile with `added` (whole lines) after every ``FROM``, the rest kept line for line."""
    found, _ = external_images(text)
    lines = text.splitlines(keepends=True)
    after = {ins.last for ins in found if ins.words and ins.words[0].upper() == "FROM"}
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        if i in after:
            out += (["\n"] if not line.endswith("\n") else []) + added
    return "".join(out)


def with_trust(text: str) -> str:
    """The Dockerfile with, after every ``FROM``, the bundle copied in and named by build
    arguments (one line each, so the rest keeps its lines)."""
    return after_every_from(text, trust_lines())


def add_to_context(context: Path, bundle: bytes) -> None:
    """The bundle in the build context, kept by the task's ``.dockerignore`` if it has one."""
    (context / TRUST_FILE).write_bytes(bundle)
    os.utime(context / TRUST_FILE, (0, 0))  # COPY keeps the mtime: the layer must not depend on when
    ignore = context / ".dockerignore"
    if ignore.is_file() and not ignore.is_symlink():
        ignore_also(context, f"!{TRUST_FILE}")
