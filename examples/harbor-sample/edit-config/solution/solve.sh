#!/bin/bash
set -euo pipefail
sed -i -e 's/^port = 8080$/port = 9090/' -e 's/^level = info$/level = debug/' /app/server.conf
