"""Makes reply.txt a FIFO nobody writes to and exits 0: a harness that opened it blocking would hang."""
import os

os.mkfifo("/workspace/reply.txt")
