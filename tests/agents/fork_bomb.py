"""Forks without end; the pids limit must hold it."""
import os

while True:
    try:
        os.fork()
    except OSError:
        pass
