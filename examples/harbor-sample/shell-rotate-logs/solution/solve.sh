#!/bin/bash
set -euo pipefail
cat > /app/rotate.sh <<'EOF'
#!/bin/bash
# rotate.sh DIR: app.log -> app.log.1 -> app.log.2 -> app.log.3; older ones are dropped
set -euo pipefail
dir=$1
rm -f "$dir/app.log.3"
for i in 2 1; do
  if [ -e "$dir/app.log.$i" ]; then mv "$dir/app.log.$i" "$dir/app.log.$((i + 1))"; fi
done
if [ -e "$dir/app.log" ]; then mv "$dir/app.log" "$dir/app.log.1"; fi
: > "$dir/app.log"
EOF
chmod +x /app/rotate.sh
