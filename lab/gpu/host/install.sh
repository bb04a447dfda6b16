#!/usr/bin/env bash
# On the GPU host once every part is in /tmp/acc: bash <bundle>/s/install.sh <bundle>
# Rejoins the parts, checks the sum and unpacks vLLM and the dependencies into /tmp/site.
# Then: . <bundle>/s/env.sh
set -euo pipefail
D=$1; . "$D/s/bundle.env"
n=$(ls /tmp/acc/part.* | wc -l)
[ "$n" -eq "$PARTS" ] || { echo "only $n of $PARTS parts in /tmp/acc (the host restarted?): send them again" >&2; exit 1; }
t=$SECONDS
B=/tmp/bundle.bin
cat /tmp/acc/part.* > $B
echo "$SHA  $B" | sha256sum -c --quiet
mkdir -p /tmp/site
piece() { dd if=$B bs=4M iflag=skip_bytes,count_bytes skip="$1" count="$2" status=none; }
piece 0 "$V_BYTES" | tar -xJf - -C /tmp/site &
piece "$V_BYTES" "$D_BYTES" | tar -xJf - -C /tmp/site
wait
rm -f $B /tmp/acc/part.*
echo "installed in $((SECONDS-t)) s: /tmp/site $(du -sh /tmp/site | cut -f1)"
