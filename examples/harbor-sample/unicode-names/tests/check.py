import sys
WANT = {
    "données/résumé.txt": 3, "数据/表.csv": 5, "Ñandú naïve.md": 3, "plain/ascii.txt": 1,
    "emoji-🦀/crab notes.txt": 2,
}
try:
    got = open("/app/inventory.tsv", "rb").read().decode("utf-8")
except (OSError, UnicodeDecodeError) as e:
    sys.exit(f"inventory.tsv: {e}")
want = "".join(f"{k}\t{v}\n" for k, v in sorted(WANT.items()))
if got != want:
    sys.exit(f"inventory differs:\n{got}")
print("ok")
