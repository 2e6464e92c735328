"""Sleeps far past any timeout, after writing a reply."""
import time

with open("/workspace/reply.txt", "w") as fh:
    fh.write("\\boxed{[1]}")
time.sleep(3600)
