#!/usr/bin/env bash
# Writes fuzz seeds built from the committed vectors into fuzz/corpus/<target>/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
v="$here/../proto/vectors/shard/v1-basic"
mkdir -p "$here/corpus/shard_reader"
sep=$'\n--ringfeed-fuzz-file--\n'
{ cat "$v/index.rfi"; printf '%s' "$sep"; cat "$v/shard-000000.rfs"; printf '%s' "$sep"; cat "$v/shard-000001.rfs"; } \
  > "$here/corpus/shard_reader/v1-basic"
echo "seeded $here/corpus/shard_reader"
