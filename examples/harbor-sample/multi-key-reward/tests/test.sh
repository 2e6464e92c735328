#!/bin/bash
# Writes reward.json with a score per function and their mean as "reward".
python3 /tests/check.py > /logs/verifier/reward.json || echo '{"reward": 0, "to_roman": 0, "from_roman": 0}' > /logs/verifier/reward.json
