#!/bin/bash
set -euo pipefail
echo $(( $(cat /app/sum.txt) * 2 )) > /app/sum.txt
