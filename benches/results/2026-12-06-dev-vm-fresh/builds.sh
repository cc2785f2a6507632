#!/usr/bin/env bash
# After fresh.sh (its FRESH directory: crates downloaded, nothing of these builds left): s3s-fs's
# install, and the release binary with and without its default features, each from an empty
# target directory.   bash builds.sh [FRESH]
set -uo pipefail
FRESH=${1:-/tmp/ringfeed-fresh}
export CARGO_HOME=$FRESH/cargo PATH=$FRESH/venv/bin:$FRESH/cargo/bin:$PATH
cd "$FRESH/ringfeed"
echo "=== cargo install s3s-fs (fresh root)"; /usr/bin/time -f "%e s wall, %U s user" cargo install -q s3s-fs@0.14.1 --features binary --locked --root "$FRESH/s3s" 2>&1 | tail -2
for f in lite full; do
  rm -rf "$FRESH/t-$f"
  if [ $f = lite ]; then args=--no-default-features; else args=; fi
  echo "=== release build, $f, empty target dir, crates downloaded"
  /usr/bin/time -f "%e s wall, %U s user, %M KB peak" cargo build -q --release --locked -p ringfeed --bin ringfeed $args --target-dir "$FRESH/t-$f" 2>&1 | tail -2
done
