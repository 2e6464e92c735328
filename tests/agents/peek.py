"""Looks for what it must not see: the answer key, host secrets, the docker socket; tries to
write outside the workspace. Prints one JSON object: path -> outcome."""
import json
import os

out = {}
for path in ["/answer_key/answer.json", "/etc/shadow", "/var/run/docker.sock", "/run/docker.sock",
             "/root/.bash_history", "/proc/1/environ"]:
    try:
        with open(path, "rb") as fh:
            fh.read(16)
        out[path] = "READ"
    except Exception as e:
        out[path] = f"denied: {type(e).__name__}"
for path in ["/etc/pwned", "/agent/agent.py", "/usr/pwned", "/pwned"]:
    try:
        with open(path, "w") as fh:
            fh.write("x")
        out["write " + path] = "WROTE"
    except Exception as e:
        out["write " + path] = f"denied: {type(e).__name__}"
out["answer_key_env"] = os.environ.get("ANSWER_KEY_DIR", "")
out["uid"] = os.getuid()
print(json.dumps(out))
