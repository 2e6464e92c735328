"""Leaves binary garbage as its reply, then points a second name at a host file."""
import os

with open("/workspace/reply.txt", "wb") as fh:
    fh.write(os.urandom(4096))
