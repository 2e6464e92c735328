"""Reads what could name the host: PID 1's command line, its own environment, the mount
table, its cgroups; lists its open file descriptors; says who it runs as. Prints one JSON object."""
import json
import os


def read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError as e:
        return f"denied: {type(e).__name__}"


out = {name: read(path)
       for name, path in [("cmdline_1", "/proc/1/cmdline"), ("environ", "/proc/self/environ"),
                          ("mountinfo", "/proc/self/mountinfo"), ("cgroup", "/proc/self/cgroup")]}
out["fds"] = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
out["stdin"] = os.readlink("/proc/self/fd/0")
out["uid_gid"] = [os.getuid(), os.getgid(), os.getgroups()]
print(json.dumps(out))
