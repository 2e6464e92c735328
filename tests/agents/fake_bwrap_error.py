"""Prints what bwrap prints when it cannot set up, then exits 1: an infrastructure fault faked."""
import os
import sys

sys.stderr.write("bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n")
sys.stderr.flush()
os._exit(1)
