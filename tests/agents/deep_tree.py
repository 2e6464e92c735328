"""Leaves a tree of directories 5,000 deep in its workspace: a recursive cleanup would raise
RecursionError."""
import os

os.chdir("/workspace")
for _ in range(5000):
    os.mkdir("d")
    os.chdir("d")
