"""Fakes bwrap's own failure message: `bwrap:` at the head of stderr, then exit 1."""
import sys

sys.stderr.write("bwrap: execvp python3: No such file or directory\n")
sys.exit(1)
