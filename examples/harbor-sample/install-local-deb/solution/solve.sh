#!/bin/bash
set -euo pipefail
dpkg -i /opt/debs/dv-greet_1.0_all.deb
