#!/bin/sh
# Shell builtins only: read and test, no program of the image but the shell itself.
expected=92
got=""
if [ -f /app/errors.txt ]; then read -r got < /app/errors.txt; fi
if [ "$got" = "$expected" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
