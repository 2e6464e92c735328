"""Writes a valid-looking reply of 200 KiB: longer than the reply text the evidence keeps."""
from deshufflelib import labels

order = labels()
text = "\\boxed{" + str(order).replace(" ", "") + "}"
with open("/workspace/reply.txt", "w") as fh:
    fh.write(" " * (200 * 1024) + text)
