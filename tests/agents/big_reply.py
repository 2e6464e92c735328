"""Writes a 1 GB reply."""
chunk = b"\\boxed{[" + b"1," * (1 << 19) + b"]}"
with open("/workspace/reply.txt", "wb") as fh:
    for _ in range((1 << 30) // len(chunk) + 1):
        fh.write(chunk)
