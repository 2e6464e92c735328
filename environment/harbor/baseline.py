"""A scripted baseline for Harbor task directories — a policy with an error model, not a model
and not an LLM.

It is served behind the local OpenAI-compatible endpoint (`validate.devtools.localserver`) under
`MODEL_NAME`, so that an evaluation of the sample dataset (``examples/harbor-sample``) runs
end to end with real variance on a machine with no LLM. It sees only what a model sees: the
task's instruction (the first user message) and what its own ``bash`` calls print. Never the
task's ``tests/``, its ``solution/`` or its id.

What it does (`policy`, stateless: each request is answered from the conversation so far):

- it recognises the kind of job the instruction asks for (`SKILLS`: a C program to fix and
  build, a CSV to convert, a config to edit, a log to summarise, a service to fix, a module to
  write, a script to write, rows to update, files to list) and takes its parameters from the
  instruction's own words (the paths, the port and level, the cut-off date and statuses);
  an instruction it does not recognise it looks around for and gives up on;
- it works in three commands: look (``cat``/``ls`` of what the instruction names), do (a
  program written for the job; for the config edit, a ``sed`` of the exact lines it saw),
  check (build, run or show the result); then it says it is done, without a tool call;
- per sample it draws one *behaviour* (`behaviour`): usually ``solve``, otherwise with
  probability `mistake_rate` (temperature and the skill's own difficulty) one of the realistic
  mistakes of `MISTAKES`: the skill's own slip (`Skill.slip`: a CSV split on commas, a config
  rewritten by ``configparser`` that loses its comments, a missing ``commit()``, a script left
  without its execute bit, ...), stopping after a look as if the work were done, a malformed
  tool call it then recovers from, exploring until the turns run out, or a command that never
  ends (the service started in the foreground, ``tail -f``) until the attempt's time is up;
- one blind spot is systematic, as a model's habit is: its median program averages the two
  middle values as ``(a + b) / 2.0`` in ``int``, which overflows for large values, so the C
  task is never solved at any temperature.

Randomness: one ``random.Random`` per decision, seeded with sha256 of the request's ``seed``,
its temperature, the instruction and the decision's name (no ``hash()``): the same request
gets the same answer in any process, and each turn of a sample re-derives the same plan.
The sha256 of this file is the "model revision" of the eval contracts that use it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from typing import Callable

MODEL_NAME = "scripted-baseline-harbor"
#: Mistakes of a whole sample and their weights (relative; see `behaviour`).
MISTAKES = {"slip": 6, "stop_early": 2, "malformed_then_solve": 2, "explore_forever": 1, "hang": 1}


def rng_for(request: dict, instruction: str, decision: str) -> random.Random:
    key = f"{request.get('seed') or 0}\n{temperature_of(request)!r}\n{instruction}\n{decision}"
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


def temperature_of(request: dict) -> float:
    t = request.get("temperature")
    return 1.0 if t is None else float(t)


def mistake_rate(temperature: float, difficulty: float) -> float:
    return min(0.9, (0.04 + 0.2 * temperature) * difficulty)


def _paths(text: str) -> list[str]:
    """The absolute paths the instruction names in backticks, in order."""
    return [p for p in re.findall(r"`(/[^`\s]+)`", text)]


def _heredoc(path: str, body: str) -> str:
    return f"cat > {path} <<'EOF_POLICY'\n{body}EOF_POLICY"


def _py(body: str) -> str:
    return f"python3 - <<'EOF_POLICY'\n{body}EOF_POLICY"


@dataclass(frozen=True)
class Job:
    """What the policy understood of one instruction: its three commands and its slip."""

    look: str
    do: Callable[[str], str]  # from what the look printed
    check: str
    slip: Callable[[str], str]
    hang: str
    difficulty: float


def median_job(text: str) -> Job | None:
    src = next((p for p in _paths(text) if p.endswith(".c")), None)
    if "median" not in text or src is None:
        return None
    app = src.split("/src/")[0] if "/src/" in src else src.rsplit("/", 1)[0]
    # The blind spot: the two middle ints are added in int before the division.
    c = ("#include <stdio.h>\n#include <stdlib.h>\n\nstatic int cmp(const void *a, const void *b) {\n"
         "    int x = *(const int *)a, y = *(const int *)b;\n    return (x > y) - (x < y);\n}\n\n"
         "int main(void) {\n    int cap = 16, n = 0, v;\n    int *xs = malloc(cap * sizeof *xs);\n"
         "    if (!xs) return 1;\n    while (scanf(\"%d\", &v) == 1) {\n"
         "        if (n == cap) { cap *= 2; xs = realloc(xs, cap * sizeof *xs); if (!xs) return 1; }\n"
         "        xs[n++] = v;\n    }\n    if (n == 0) { fprintf(stderr, \"no input\\n\"); return 1; }\n"
         "    qsort(xs, n, sizeof *xs, cmp);\n"
         "    double m = n % 2 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2.0;\n"
         "    printf(\"%.1f\\n\", m);\n    free(xs);\n    return 0;\n}\n")
    return Job(look=f"cat {src}; cat {app}/Makefile", do=lambda seen: _heredoc(src, c) + f"\ncd {app} && make",
               check=f"printf '3 1 2' | {app}/median; printf '4 1 3 2' | {app}/median",
               slip=lambda seen: _heredoc(src, c), hang=f"tail -f {src}", difficulty=1.0)


def csv_job(text: str) -> Job | None:
    m = re.search(r"Convert `(/\S+\.csv)`.*?to `(/\S+\.json)`", text, re.S)
    if m is None:
        return None
    src, dst = m.groups()
    keys = re.findall(r"`(\w+)` \((string|integer)\)", text)
    conv = ", ".join(f"{k!r}: {'int' if t == 'integer' else 'str'}(r[{k!r}])" for k, t in keys)
    good = (f"import csv, json\nwith open({src!r}, newline='', encoding='utf-8') as f:\n"
            f"    rows = [{{{conv}}} for r in csv.DictReader(f)]\n"
            f"json.dump(rows, open({dst!r}, 'w', encoding='utf-8'), ensure_ascii=False, indent=2)\n")
    naive = (f"import json\nlines = open({src!r}, encoding='utf-8').read().splitlines()\nhead = lines[0].split(',')\n"
             f"rows = [dict(zip(head, ln.split(','))) for ln in lines[1:]]\n"
             f"json.dump(rows, open({dst!r}, 'w', encoding='utf-8'), ensure_ascii=False)\n")
    return Job(look=f"head -n 5 {src}", do=lambda seen: _py(good), check=f"head -c 400 {dst}",
               slip=lambda seen: _py(naive), hang=f"tail -f {src}", difficulty=1.0)


def reverse_job(text: str) -> Job | None:
    m = re.search(r"lines of `(/\S+)` in reverse order to `(/\S+)`", text)
    if m is None:
        return None
    src, dst = m.groups()
    return Job(look=f"cat -A {src}", do=lambda seen: f"tac {src} > {dst}", check=f"cat -A {dst}",
               slip=lambda seen: f"rev {src} > {dst}", hang=f"tail -f {src}", difficulty=0.3)


def config_job(text: str) -> Job | None:
    m = re.search(r"In `(/\S+)`, change the server's port to (\d+) and the logging level to\s+`(\w+)`", text)
    if m is None:
        return None
    path, port, level = m.groups()

    def do(seen: str) -> str:
        old_port = re.search(r"^port = (\S+)$", seen, re.M)
        old_level = re.search(r"^level = (\S+)$", seen, re.M)
        edits = [f"-e 's/^port = {old_port.group(1)}$/port = {port}/'" if old_port else "",
                 f"-e 's/^level = {old_level.group(1)}$/level = {level}/'" if old_level else ""]
        return f"sed -i {' '.join(e for e in edits if e)} {path}"

    rewrite = (f"import configparser\nc = configparser.ConfigParser()\nc.read({path!r})\n"
               f"c['server']['port'] = {port!r}\nc['logging']['level'] = {level!r}\n"
               f"c.write(open({path!r}, 'w'))\n")
    return Job(look=f"cat {path}", do=do, check=f"cat {path}", slip=lambda seen: _py(rewrite),
               hang=f"tail -f {path}", difficulty=0.5)


def log_job(text: str) -> Job | None:
    paths = _paths(text)
    if "5xx" not in text or len(paths) < 2:
        return None
    log, out = paths[0], paths[1]
    body = ("import collections, datetime, re\ncounts = collections.Counter()\n"
            f"for line in open({log!r}):\n"
            "    m = re.search(r'\\[([^\\]]+)\\] \"[^\"]*\" (\\d{3}) ', line)\n"
            "    if m and m.group(2).startswith('5'):\n"
            "        t = datetime.datetime.strptime(m.group(1), '%d/%b/%Y:%H:%M:%S %z')\n"
            "        counts[t.astimezone(datetime.timezone.utc).strftime('%Y-%m-%dT%H')] += 1\n"
            f"with open({out!r}, 'w') as f:\n    HEADER\n"
            "    for hour in sorted(counts):\n        f.write(f'{hour},{counts[hour]}\\n')\n")
    return Job(look=f"head -n 3 {log}; wc -l {log}", do=lambda seen: _py(body.replace("HEADER", "f.write('hour,count\\n')")),
               check=f"head -n 5 {out}", slip=lambda seen: _py(body.replace("HEADER", "pass")),
               hang=f"tail -f {log}", difficulty=1.5)


def kv_job(text: str) -> Job | None:
    path = next((p for p in _paths(text) if p.endswith(".py")), None)
    if "key-value store" not in text or "DELETE" not in text or path is None:
        return None
    server = ('"""A tiny key-value store over HTTP: PUT, GET and DELETE /kv/<key>."""\nimport argparse\n'
              "from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer\n\nSTORE = {}\n\n\n"
              "class Handler(BaseHTTPRequestHandler):\n    def _key(self):\n"
              "        return self.path[len('/kv/'):] if self.path.startswith('/kv/') else None\n\n"
              "    def _send(self, code, body=b''):\n        self.send_response(code)\n"
              "        self.send_header('Content-Length', str(len(body)))\n        self.end_headers()\n"
              "        self.wfile.write(body)\n\n    def do_PUT(self):\n        key = self._key()\n"
              "        if not key:\n            return self._send(400)\n"
              "        STORE[key] = self.rfile.read(int(self.headers.get('Content-Length', '0')))\n"
              "        self._send(201)\n\n    def do_GET(self):\n        key = self._key()\n"
              "        if not key or key not in STORE:\n            return self._send(404 if key else 400)\n"
              "        self._send(200, STORE[key])\n\n    def do_DELETE(self):\n        key = self._key()\n"
              "        if not key or key not in STORE:\n            return self._send(404 if key else 400)\n"
              "        del STORE[key]\n        self._send(DELETED)\n\n    def log_message(self, *args):\n"
              "        pass\n\n\nif __name__ == '__main__':\n    ap = argparse.ArgumentParser()\n"
              "    ap.add_argument('--port', type=int, default=8000)\n    args = ap.parse_args()\n"
              "    ThreadingHTTPServer(('127.0.0.1', args.port), Handler).serve_forever()\n")
    probe = (f"python3 {path} --port 18080 >/dev/null 2>&1 & sleep 1; python3 -c \"import urllib.request as u\n"
             "r = u.Request('http://127.0.0.1:18080/kv/a', data=b'1', method='PUT'); print(u.urlopen(r).status)\n"
             "r = u.Request('http://127.0.0.1:18080/kv/a', method='DELETE'); print(u.urlopen(r).status)\"; kill %1")
    return Job(look=f"cat {path}", do=lambda seen: _heredoc(path, server.replace("DELETED", "204")), check=probe,
               slip=lambda seen: _heredoc(path, server.replace("DELETED", "200")),
               hang=f"python3 {path} --port 18080", difficulty=2.0)


ROMAN = ("_PAIRS = [(1000, 'M'), (900, 'CM'), (500, 'D'), (400, 'CD'), (100, 'C'), (90, 'XC'),\n"
         "          (50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')]\n\n\n"
         "def to_roman(n):\n    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 3999:\n"
         "        raise ValueError(n)\n    out = []\n    for value, letters in _PAIRS:\n"
         "        while n >= value:\n            out.append(letters)\n            n -= value\n"
         "    return ''.join(out)\n\n\ndef from_roman(s):\n    if not isinstance(s, str) or not s:\n"
         "        raise ValueError(s)\n    total, i = 0, 0\n    for value, letters in _PAIRS:\n"
         "        while s.startswith(letters, i):\n            total += value\n            i += len(letters)\n"
         "    if i != len(s)CANONICAL:\n        raise ValueError(s)\n    return total\n")


def roman_job(text: str) -> Job | None:
    path = next((p for p in _paths(text) if p.endswith(".py")), None)
    if "to_roman" not in text or path is None:
        return None
    return Job(look=f"ls -la {path.rsplit('/', 1)[0]}; cat {path} 2>/dev/null",
               do=lambda seen: _heredoc(path, ROMAN.replace("CANONICAL", " or to_roman(total) != s")),
               check=f"cd {path.rsplit('/', 1)[0]} && python3 -c 'import roman; print(roman.to_roman(1994))'",
               slip=lambda seen: _heredoc(path, ROMAN.replace("CANONICAL", "")), hang=f"tail -f {path}",
               difficulty=1.5)


def slug_job(text: str) -> Job | None:
    m = re.search(r"`(\w+)` in `(/\S+)`.*?`(\w+/\w+\.py)`", text, re.S)
    if "slugify" not in text or m is None:
        return None
    _, app, rel = m.groups()
    path = f"{app}/{rel}"
    core = ('"""Small text helpers."""\nimport re\nimport unicodedata\n\n\ndef slugify(title: str) -> str:\n'
            "    ascii_text = NORMALISE\n"
            "    return re.sub(r'[^a-z0-9]+', '-', ascii_text.lower()).strip('-')\n\n\n"
            "def word_count(text: str) -> int:\n    return len(text.split())\n")
    good = "unicodedata.normalize('NFKD', title).encode('ascii', 'ignore').decode()"
    return Job(look=f"cat {path}; ls {app}/tests", do=lambda seen: _heredoc(path, core.replace("NORMALISE", good)),
               check=f"cd {app} && python3 -m pytest -q 2>&1 | tail -n 3",
               slip=lambda seen: _heredoc(path, core.replace("NORMALISE", "title.encode('ascii', 'ignore').decode()")),
               hang=f"tail -f {path}", difficulty=1.5)


def rotate_job(text: str) -> Job | None:
    path = next((p for p in _paths(text) if p.endswith(".sh")), None)
    if "rotates" not in text or path is None:
        return None
    script = ('#!/bin/bash\nset -euo pipefail\ndir=$1\nrm -f "$dir/app.log.3"\nfor i in 2 1; do\n'
              '  if [ -e "$dir/app.log.$i" ]; then mv "$dir/app.log.$i" "$dir/app.log.$((i + 1))"; fi\ndone\n'
              'if [ -e "$dir/app.log" ]; then mv "$dir/app.log" "$dir/app.log.1"; fi\n: > "$dir/app.log"\n')
    return Job(look=f"ls -la {path.rsplit('/', 1)[0]}; id", do=lambda seen: _heredoc(path, script) + f"\nchmod +x {path}",
               check=f"ls -la {path}; bash -n {path} && echo syntax ok", slip=lambda seen: _heredoc(path, script),
               hang=f"tail -f {path}", difficulty=1.0)


def sqlite_job(text: str) -> Job | None:
    m = re.search(r"`(/\S+\.db)`.*?`(\w+)\(", text, re.S)
    cut = re.search(r"before (\d{4}-\d\d-\d\d) whose status is\s+`'(\w+)'` or `'(\w+)'`", text)
    new = re.search(r"Set `(\w+)` to `'(\w+)'`", text)
    if m is None or cut is None or new is None:
        return None
    db, table = m.groups()
    day, a, b = cut.groups()
    col, value = new.groups()
    body = (f"import sqlite3\ndb = sqlite3.connect({db!r})\n"
            f"db.execute(\"UPDATE {table} SET {col} = '{value}' WHERE placed_on < '{day}' AND {col} IN ('{a}', '{b}')\")\n")
    return Job(look=f"python3 -c \"import sqlite3; db = sqlite3.connect('{db}'); "
                    f"print(db.execute('SELECT {col}, count(*) FROM {table} GROUP BY 1').fetchall())\"",
               do=lambda seen: _py(body + "db.commit()\n"),
               check=f"python3 -c \"import sqlite3; db = sqlite3.connect('{db}'); "
                     f"print(db.execute('SELECT {col}, count(*) FROM {table} GROUP BY 1').fetchall())\"",
               slip=lambda seen: _py(body), hang=f"tail -f {db}", difficulty=1.0)


def inventory_job(text: str) -> Job | None:
    paths = _paths(text)
    if "one line per regular file under" not in text or len(paths) < 2:
        return None
    out, root = paths[0], paths[1]
    body = ("import os\nrows = []\n"
            f"for d, _, names in os.walk({root!r}):\n    for n in names:\n        p = os.path.join(d, n)\n"
            "        with open(p, 'rb') as f:\n            rows.append((os.path.relpath(p, BASE), f.read().count(b'\\n')))\n"
            f"with open({out!r}, 'w', encoding='utf-8') as out:\n"
            "    for rel, n in sorted(rows):\n        out.write(f'{rel}\\t{n}\\n')\n")
    return Job(look=f"find {root} -type f | head -n 20", do=lambda seen: _py(body.replace("BASE", repr(root))),
               check=f"cat {out}", slip=lambda seen: _py(body.replace("BASE", repr(root.rsplit("/", 1)[0]))),
               hang=f"tail -f {out}", difficulty=1.0)


SKILLS = (median_job, csv_job, reverse_job, config_job, log_job, kv_job, roman_job, slug_job, rotate_job, sqlite_job,
          inventory_job)


def understand(text: str) -> Job | None:
    for skill in SKILLS:
        job = skill(text)
        if job is not None:
            return job
    return None


def behaviour(request: dict, instruction: str, difficulty: float) -> str:
    rng = rng_for(request, instruction, "behaviour")
    if rng.random() >= mistake_rate(temperature_of(request), difficulty):
        return "solve"
    names = sorted(MISTAKES)
    return rng.choices(names, weights=[MISTAKES[n] for n in names])[0]


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def call(command: str, turn: int, raw: str | None = None) -> dict:
    args = raw if raw is not None else json.dumps({"command": command})
    return {"content": None, "tool_calls": [{"id": f"call_{turn}", "type": "function",
                                             "function": {"name": "bash", "arguments": args}}]}


def policy(request: dict) -> dict:
    """The local server's policy: the next assistant message of the conversation so far."""
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    instruction = next((_text(m) for m in messages if m.get("role") == "user"), "")
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    tools = [_text(m) for m in messages if m.get("role") == "tool"]
    job = understand(instruction)
    if job is None:
        return call("ls -la; ls -la /app 2>/dev/null", turn) if turn == 0 else \
            {"content": "I could not work out what this task asks for, so I changed nothing."}
    mode = behaviour(request, instruction, job.difficulty)
    if mode == "malformed_then_solve":
        if turn == 0:
            return call("", turn, raw=json.dumps({"cmd": job.look}))
        turn, tools = turn - 1, tools[1:]  # the error message it got is not a step of the work
    if mode == "explore_forever":
        return call(f"{job.look} | head -n {turn + 3}; ls -la", turn)
    if turn == 0:
        return call(job.look, turn)
    if mode == "stop_early":
        return {"content": "I looked at the files; they already do what the task asks, so nothing needs changing."}
    if mode == "hang":
        return call(job.hang, turn)
    seen = tools[0] if tools else ""
    if turn == 1:
        return call((job.slip if mode == "slip" else job.do)(seen), turn)
    if turn == 2:
        return call(job.check, turn)
    return {"content": "Done: the change is made and checked."}
