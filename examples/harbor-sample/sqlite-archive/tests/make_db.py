"""Builds the shop database; seeded, so the same file comes out every time."""
import datetime, random, sqlite3, sys

def build(path):
    rng = random.Random(20240611)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, "
               "placed_on TEXT NOT NULL, status TEXT NOT NULL, total_cents INTEGER NOT NULL)")
    start = datetime.date(2023, 1, 1)
    customers = ["ada", "brahmagupta", "cauchy", "dedekind", "euler", "fermat", "gauss"]
    for i in range(1, 241):
        day = start + datetime.timedelta(days=rng.randrange(0, 730))
        status = rng.choice(["open", "shipped", "shipped", "cancelled"])
        db.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
                   (i, rng.choice(customers), day.isoformat(), status, rng.randrange(100, 100000)))
    db.commit()
    db.close()

if __name__ == "__main__":
    build(sys.argv[1])
