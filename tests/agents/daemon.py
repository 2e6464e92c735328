"""Leaves a background process behind that keeps writing a file, then exits 0."""
import os
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for i in range(600):
            with open("/workspace/daemon-heartbeat", "w") as fh:
                fh.write(str(i))
            time.sleep(0.05)
    os._exit(0)
