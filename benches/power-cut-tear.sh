#!/bin/bash
# Emulates on a stopped node's directory what a power cut under
# `--fsync never` may leave (format-spec/storage.md section 10, cases 1
# and 5): the newest journal file that holds frames is cut 100 bytes into
# the frame of GROUP's record KEEP + 1 (a torn tail: that frame and every
# later one are lost), while GROUP's segment file keeps every record
# written to it (it leads the journal). Run it on a copy made by
# `LEAD_GROUP=GROUP SERVE_FLAGS='--fsync never' benches/crash-tail.sh`:
#   cp -a /tmp/pop/clean /tmp/pop/cut
#   LEAD_GROUP=7 SERVE_FLAGS='--fsync never' bash benches/crash-tail.sh BIN /tmp/pop/cut 1000000 200
#   bash benches/power-cut-tear.sh BIN /tmp/pop/cut 7 30
set -euo pipefail
BIN=$1
DIR=$2
GROUP=$3
KEEP=$4
file=
for f in "$DIR"/journal/*.tmj; do
    if [ "$(stat -c %s "$f")" -gt 48 ]; then file=$f; fi
done
seq=$(basename "$file" .tmj | sed 's/^0*//')
# The frame whose Records entry of GROUP starts at msg_id KEEP + 1.
offset=$("$BIN" ctl dump --data "$DIR" --journal "$seq" --json |
    jq -r --argjson g "$GROUP" --arg ids "msg_ids $((KEEP + 1))..=" \
        '.frames[] | select(any(.entries[]; .group == $g and .kind == "Records"
            and (.body | startswith($ids)))) | .offset' | head -n 1)
[ -n "$offset" ] || { echo "no frame of group $GROUP record $((KEEP + 1)) in $file" >&2; exit 1; }
echo "$file: $(stat -c %s "$file") bytes, cut at $((offset + 100)) (frame at $offset)"
truncate -s $((offset + 100)) "$file"
