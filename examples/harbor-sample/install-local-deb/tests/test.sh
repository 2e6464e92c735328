#!/bin/bash
# The reward is 1 when dpkg lists the package as installed and the command runs, else 0.
status=$(dpkg-query -W -f='${Status}' dv-greet 2>/dev/null || true)
out=$(dv-greet 2>/dev/null || true)
if [ "$status" = "install ok installed" ] && [ "$out" = "hello from dv-greet" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
