import sys
want = "".join(("FizzBuzz" if i % 15 == 0 else "Fizz" if i % 3 == 0 else "Buzz" if i % 5 == 0 else str(i))
               + "\n" for i in range(1, 101))
try:
    got = open("/srv/fizzbuzz.txt").read()
except OSError as e:
    sys.exit(str(e))
sys.exit(0 if got == want else "fizzbuzz.txt is wrong")
