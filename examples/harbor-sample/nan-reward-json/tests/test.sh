#!/bin/bash
if python3 /tests/check.py; then ok=1; else ok=0; fi
printf '{"reward": %s, "style": NaN}\n' "$ok" > /logs/verifier/reward.json
