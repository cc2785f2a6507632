#!/usr/bin/env bash
# Every GPU-machine benchmark of results/2026-11-30-h200-host-3/, in the order they ran there.
# Build first (on a machine without a registry, build elsewhere and copy the two binaries):
#   cargo build --release -p ringfeed --bin ringfeed --example corpus_rate
# Usage:
#   RINGFEED_BIN=target/release/ringfeed CORPUS_RATE_BIN=target/release/examples/corpus_rate \
#     MAKE_PHOTOS=benches/make_photos.py benches/e2e/h200_all.sh OUT_DIR
# (the committed results ran these lines split over several runs of at most 10 minutes each).
set -euxo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: h200_all.sh OUT_DIR}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/client-py RINGFEED_LOG=warn
if [ ! -f bench-data/packed/index.rfi ]; then
  python3 "${MAKE_PHOTOS:?}" bench-data/corpus --count 8000 --jobs 16 > /dev/null
  "$RINGFEED_BIN" pack bench-data/corpus bench-data/packed --progress none
fi
python3 benches/e2e/h2d.py bench-data/packed --json "$out/h2d.json"
python3 benches/e2e/cpu_scaling.py --images bench-data/corpus --packed bench-data/packed --threads 1,4,8,15 --batches 24 --out "$out/cpu"
python3 benches/e2e/gpu_train.py --images bench-data/corpus --packed bench-data/packed --models resnet50,resnet18 --workers 15 --steps 150 --out "$out/gpu"
python3 benches/autotune.py bench-data/packed --out "$out/autotune-gpu" --batch-size 256 --fixed 6,8,10,15 --seconds 12 --auto-seconds 40 --threads 16 --model resnet50 --skip-sim
python3 benches/autotune.py bench-data/packed --out "$out/autotune" --step-ms 40 --batch-size 128 --fixed 4,6,8,15 --seconds 12 --auto-seconds 30 --threads 16
# The per-core rate of a contention-free decode alone, and beside 14 busy cores doing the same.
mkdir -p "$out/percore"
"$CORPUS_RATE_BIN" bench-data/corpus decode 1 1 > "$out/percore/alone.json"
("$CORPUS_RATE_BIN" bench-data/corpus decode 14 20 > "$out/percore/neighbours.json") & sleep 4
"$CORPUS_RATE_BIN" bench-data/corpus decode 1 1 > "$out/percore/beside-14.json"
wait
