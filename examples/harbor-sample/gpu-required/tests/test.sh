#!/bin/bash
# Runs the checks; the reward is 1 when they all pass, else 0.
if python3 /tests/check.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
