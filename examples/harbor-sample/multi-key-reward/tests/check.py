import json, sys
sys.path.insert(0, "/app")

def score(cases):
    ok = 0
    for fn, arg, want in cases:
        try:
            got = fn(arg)
        except ValueError:
            got = ValueError
        except Exception:
            got = None
        ok += got == want
    return ok / len(cases)

try:
    from roman import from_roman, to_roman
except Exception:
    print(json.dumps({"reward": 0, "to_roman": 0, "from_roman": 0}))
    sys.exit(0)
known = {1: "I", 4: "IV", 9: "IX", 14: "XIV", 40: "XL", 90: "XC", 400: "CD", 1994: "MCMXCIV",
         2024: "MMXXIV", 3999: "MMMCMXCIX"}
t = score([(to_roman, n, r) for n, r in known.items()] + [(to_roman, 0, ValueError), (to_roman, 4000, ValueError)])
f = score([(from_roman, r, n) for n, r in known.items()]
          + [(from_roman, s, ValueError) for s in ("IIII", "IC", "", "MMMM", "VX", "abc")])
print(json.dumps({"reward": round((t + f) / 2, 6), "to_roman": round(t, 6), "from_roman": round(f, 6)}))
