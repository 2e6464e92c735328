#!/bin/bash
if python3 /tests/check.py; then ok=1; else ok=0; fi
if [ "$ok" = 1 ]; then echo PASSED; else echo FAILED; fi > /logs/verifier/reward.txt
