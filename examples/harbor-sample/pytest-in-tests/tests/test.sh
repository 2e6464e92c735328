#!/bin/bash
# The same checks as python-pytest's, run where no agent file can be in their way: from /tests
# (the harness's), pytest's root and configuration pinned there (-c /dev/null reads no ini
# file; --rootdir /tests loads no conftest.py above it), the package imported by the test itself
# (sys.path, once Python has started: nothing of /app runs at its start-up).
cd /tests || exit 1
if /usr/bin/python3 -m pytest -q -p no:cacheprovider -c /dev/null --rootdir=/tests test_hidden.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
