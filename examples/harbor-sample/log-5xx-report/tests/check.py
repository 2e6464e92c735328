"""Regenerates the log from its seed (the agent may have edited /app/access.log)."""
import collections, re, sys
sys.path.insert(0, "/tests")
from make_log import lines

MONTHS = {m: i for i, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}
counts = collections.Counter()
for line in lines():
    m = re.search(r"\[(\d\d)/(\w{3})/(\d{4}):(\d\d):", line)
    status = line.split('" ')[1].split()[0]
    if status.startswith("5"):
        day, mon, year, hour = m.groups()
        counts[f"{year}-{MONTHS[mon]:02d}-{day}T{hour}"] += 1
want = "hour,count\n" + "".join(f"{h},{counts[h]}\n" for h in sorted(counts))
try:
    got = open("/app/report.csv").read()
except OSError as e:
    sys.exit(f"report.csv: {e}")
if got.replace("\r\n", "\n") != want:
    sys.exit("report.csv differs from the expected counts")
print("ok")
