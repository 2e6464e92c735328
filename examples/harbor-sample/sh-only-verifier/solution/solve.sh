#!/bin/sh
set -eu
grep -c ' ERROR ' /app/app.log > /app/errors.txt
