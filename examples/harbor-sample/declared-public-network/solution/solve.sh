#!/bin/bash
set -euo pipefail
tac /app/poem.txt > /app/poem-reversed.txt
