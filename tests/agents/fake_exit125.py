"""Fakes the old bwrap sign of a sandbox that did not start: exit 125."""
import sys

sys.stderr.write("bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n")
sys.exit(125)
