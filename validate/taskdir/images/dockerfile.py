"""A Dockerfile's external images, and the rewrite that points them at local images.

`external_images` lists every image a Dockerfile reads from outside itself: each ``FROM``
(all stages) that names neither an earlier stage nor ``scratch``, and each
``COPY --from=<image>`` that names no stage. `rewrite` replaces exactly those references by
the local image ids a base-image map resolved them to and returns the new text with a
unified diff of the change: that diff is the patch recorded for the task. Every other line
is kept byte for byte. No upstream name is ever tagged in a backend: the rewritten
Dockerfile names the local image by id.

Parsed as Docker's parser does where it matters here: the ``# escape=`` directive, line
continuations, comment lines inside a continuation, ``--flag`` words before the image, and
``AS <stage>`` names, compared case-insensitively. A reference made by ``ARG`` (``${BASE}``)
cannot be resolved without running the build's argument logic, so it is reported as such
(`Unresolvable`) rather than guessed.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from validate.core.errors import TaskError

#: Bumped whenever `rewrite`'s output changes for the same input (it is part of the patch).
REWRITE_VERSION = 1
_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z]+)\s*=\s*(\S+)\s*$")


class DockerfileError(TaskError):
    """The Dockerfile cannot be read as one (the task's fault)."""


class Unresolvable(TaskError):
    """A reference this harness cannot name statically (made by ``ARG``)."""


@dataclass(frozen=True)
class Instruction:
    first: int  # index of its first physical line
    last: int  # index of its last physical line
    words: tuple[str, ...]


@dataclass(frozen=True)
class Reference:
    """An external image reference: where it stands and how it is used."""

    instruction: int  # index into the instruction list
    image: str
    kind: str  # "from" or "copy-from"


def _escape_char(lines: list[str]) -> str:
    for line in lines:  # parser directives lead the file; the first other line ends them
        m = _DIRECTIVE.match(line.strip())
        if not m:
            break
        if m.group(1).lower() == "escape":
            if m.group(2) not in ("\\", "`"):
                raise DockerfileError(f"invalid escape directive {m.group(2)!r}")
            return m.group(2)
    return "\\"


def instructions(text: str) -> list[Instruction]:
    """Logical instructions with their physical line span; comments and blank lines dropped."""
    lines = text.splitlines()
    escape = _escape_char(lines)
    found, words, first = [], [], None
    for i, line in enumerate(lines):
        stripped = line.strip()
        if first is None and (not stripped or stripped.startswith("#")):
            continue
        if first is not None and stripped.startswith("#"):
            continue  # a comment inside a continuation is dropped by Docker's parser too
        first = i if first is None else first
        continued = stripped.endswith(escape)
        words += (stripped[:-1] if continued else stripped).split()
        if not continued:
            found.append(Instruction(first, i, tuple(words)))
            words, first = [], None
    if first is not None:
        found.append(Instruction(first, len(lines) - 1, tuple(words)))
    return found


def external_images(text: str) -> tuple[list[Instruction], list[Reference]]:
    """The instructions and every external image they reference, in order."""
    found = instructions(text)
    if not any(ins.words and ins.words[0].upper() == "FROM" for ins in found):
        raise DockerfileError("no FROM instruction")
    stages: set[str] = set()
    refs: list[Reference] = []
    for n, ins in enumerate(found):
        keyword = ins.words[0].upper()
        args = [w for w in ins.words[1:] if not w.startswith("--")]
        if keyword == "FROM":
            if not args:
                raise DockerfileError(f"line {ins.first + 1}: FROM names no image")
            if args[0].lower() not in stages and args[0].lower() != "scratch":
                refs.append(Reference(n, args[0], "from"))
            if len(args) >= 3 and args[1].upper() == "AS":
                stages.add(args[2].lower())
            stages.add(str(len([r for r in found[:n] if r.words[0].upper() == "FROM"])))  # stage index
        elif keyword == "COPY":
            for w in ins.words[1:]:
                source = w[len("--from="):] if w.lower().startswith("--from=") else None
                if source is not None and source.lower() not in stages:
                    refs.append(Reference(n, source, "copy-from"))
    for ref in refs:
        if "$" in ref.image:
            raise Unresolvable(f"the image {ref.image!r} is made by ARG; only a named image can be served")
    return found, refs


def rewrite(text: str, served: dict[str, str]) -> tuple[str, str]:
    """(the Dockerfile with every external reference replaced by ``served[reference]``, the
    unified diff from the original). Each rewritten instruction becomes one line."""
    found, refs = external_images(text)
    lines = text.splitlines(keepends=True)
    replaced: dict[int, str] = {}
    for ref in refs:
        ins = found[ref.instruction]
        words = list(replaced.get(ref.instruction, "").split() or ins.words)
        if ref.kind == "from":
            at = next(i for i, w in enumerate(words) if i > 0 and not w.startswith("--"))
            words[at] = served[ref.image]
        else:
            words = [f"--from={served[ref.image]}" if w.lower() == f"--from={ref.image}".lower() else w
                     for w in words]
        replaced[ref.instruction] = " ".join(words)
    out: list[str] = []
    skip_until = -1
    for i, line in enumerate(lines):
        if i <= skip_until:
            continue
        n = next((n for n in replaced if found[n].first == i), None)
        if n is None:
            out.append(line)
            continue
        # Comment lines inside the replaced continuation go with it; the new line ends like the old one.
        ending = "\n" if lines[found[n].last].endswith("\n") else ""
        out.append(replaced[n] + ending)
        skip_until = found[n].last
    new = "".join(out)
    diff = "".join(difflib.unified_diff(lines, new.splitlines(keepends=True),
                                        "a/environment/Dockerfile", "b/environment/Dockerfile"))
    return new, diff


def ignore_also(context: Path, pattern: str) -> None:
    """`pattern` appended as a line of `context`'s ``.dockerignore`` (a regular file), its other
    bytes kept as they are."""
    ignore = context / ".dockerignore"
    text = ignore.read_bytes()
    ignore.write_bytes(text + (b"" if text.endswith(b"\n") or not text else b"\n") + pattern.encode() + b"\n")
