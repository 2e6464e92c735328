import hashlib, sys
try:
    got = open("/app/top10.txt", "rb").read()
except OSError as e:
    sys.exit(str(e))
ok = hashlib.sha256(got).hexdigest() == "6abfd1529a41878057e94097f6a3bdacd6ef79254c452a51bc1b17cbf020b254"
sys.exit(0 if ok else "top10.txt is wrong")
