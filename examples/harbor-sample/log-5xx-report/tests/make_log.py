"""Writes the access log; seeded, so the same log comes out every time."""
import datetime, random, sys

def lines():
    rng = random.Random(77)
    t = datetime.datetime(2024, 3, 9, 22, 0, 0)
    for _ in range(1500):
        t += datetime.timedelta(seconds=rng.randrange(1, 30))
        status = rng.choice([200] * 12 + [301, 404, 500, 502, 503])
        ip = ".".join(str(rng.randrange(1, 255)) for _ in range(4))
        path = rng.choice(["/", "/api/items", "/login", "/static/app.js"])
        stamp = t.strftime("%d/%b/%Y:%H:%M:%S +0000")
        yield f'{ip} - - [{stamp}] "GET {path} HTTP/1.1" {status} {rng.randrange(100, 5000)}\n'

if __name__ == "__main__":
    with open(sys.argv[1], "w") as f:
        f.writelines(lines())
