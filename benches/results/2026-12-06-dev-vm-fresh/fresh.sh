#!/usr/bin/env bash
# How the fresh-machine times were taken: a Debian machine with Rust and Python only, simulated on
# a used one. Removes cmake and nasm (the scripts install them again), and uses an empty
# CARGO_HOME (every crate downloaded and built again), a new virtualenv (no torch), no pip cache
# and a fresh clone. Then times ./scripts/demo, then ./scripts/test, on the same machine.
#   bash fresh.sh REPO [FRESH]   REPO: a checkout to clone; FRESH: a scratch directory
# It runs apt-get remove: use it on a machine of your own only.
set -uo pipefail
REPO=$1 FRESH=${2:-/tmp/ringfeed-fresh}
rm -rf "$FRESH"; mkdir -p "$FRESH"
apt-get remove -y -qq cmake nasm >/dev/null 2>&1; apt-get autoremove -y -qq >/dev/null 2>&1
if command -v cmake || command -v nasm; then echo "cmake/nasm still present"; exit 1; fi
git clone -q "$REPO" "$FRESH/ringfeed"
python3 -m venv "$FRESH/venv"
export CARGO_HOME=$FRESH/cargo PATH=$FRESH/venv/bin:$FRESH/cargo/bin:$PATH PIP_NO_CACHE_DIR=1 VIRTUAL_ENV=$FRESH/venv
cd "$FRESH/ringfeed"
git log --oneline -1
echo "=== demo"; /usr/bin/time -v ./scripts/demo > "$FRESH/demo.log" 2>&1; echo "demo rc=$?"
tail -3 "$FRESH/demo.log"
echo "=== test"; /usr/bin/time -v ./scripts/test > "$FRESH/test.log" 2>&1; echo "test rc=$?"
tail -3 "$FRESH/test.log"
