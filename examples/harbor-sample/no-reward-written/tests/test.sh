#!/bin/bash
# writes its verdict where no harness looks
if python3 /tests/check.py; then echo pass > /logs/verifier/result.txt; else echo fail > /logs/verifier/result.txt; fi
