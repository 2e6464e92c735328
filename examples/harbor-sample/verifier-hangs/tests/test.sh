#!/bin/bash
# waits for a "ready" signal that never comes
mkfifo /tmp/ready
read -r _ < /tmp/ready
if python3 /tests/check.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
