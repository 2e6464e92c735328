#!/bin/bash
set -euo pipefail
echo '{"debug": false, "workers": 4}' > /app/config.json
