"""Makes reply.txt a directory and exits 0."""
import os

os.mkdir("/workspace/reply.txt")
