"""Fakes the old docker sign of an outside kill: leaves a reply, then SIGKILLs itself (exit 137)."""
import os
import signal

with open("/workspace/reply.txt", "w") as fh:
    fh.write("\\boxed{[1]}")
os.kill(os.getpid(), signal.SIGKILL)
