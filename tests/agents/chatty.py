"""Floods stdout and stderr (16 MiB each, interleaved, far past a pipe's buffer), then replies."""
import sys

from deshufflelib import answer

chunk = 64 * 1024
for _ in range(256):
    sys.stdout.write("o" * chunk)
    sys.stderr.write("e" * chunk)
answer([1])
