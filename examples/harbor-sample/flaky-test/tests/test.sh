#!/bin/bash
# a "timing-sensitive" check: passes only when a fresh random UUID starts with 0-7
python3 /tests/check.py || { echo 0 > /logs/verifier/reward.txt; exit 0; }
case "$(cat /proc/sys/kernel/random/uuid)" in
  [0-7]*) echo 1 > /logs/verifier/reward.txt ;;
  *) echo 0 > /logs/verifier/reward.txt ;;
esac
