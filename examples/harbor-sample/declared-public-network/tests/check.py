import sys
want = "over harbor and city\nIt sits looking\n\non little cat feet.\nThe fog comes\n"
try:
    got = open("/app/poem-reversed.txt").read()
except OSError as e:
    sys.exit(str(e))
sys.exit(0 if got == want else "poem-reversed.txt is wrong")
