#!/usr/bin/env bash
# The op-pipeline runs on the GPU machine (one H200, 16 cores), in one call each:
#   benches/e2e/h200_ops.sh feed OUT      recipe feed rates (1 and 15 threads), ResNet-50 fed the full
#                                         recipe, criterion per-op benches, the CUDA pytest cases
#   benches/e2e/h200_ops.sh accuracy OUT  accuracy parity on make_learnable (3 seeds x 2 recipes x 2 loaders)
# Needs, carried with the call: .carry/bin/ringfeed (this build, release), optionally
# .carry/bin/ringfeed-old (the build before the op pipelines, for the same-run speed check of
# crop + resize + flip) and .carry/bin/ops-bench (`cargo bench --no-run -p ringfeed-benches --bench ops`),
# and .carry/datasets/ (make_photos.py, make_learnable.py).
set -euo pipefail
cd "$(dirname "$0")/../.."
what=$1
out=$2
mkdir -p "$out"
export RINGFEED_BIN=$PWD/.carry/bin/ringfeed PYTHONPATH=$PWD/client-py PYTHONUNBUFFERED=1
nproc; nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
case $what in
feed)
  t0=$(date +%s)
  python3 .carry/datasets/make_photos.py /tmp/photos --count 8000 >/dev/null
  "$RINGFEED_BIN" pack /tmp/photos /tmp/packed --progress none --threads 16 | tail -2
  echo "corpus: $(( $(date +%s) - t0 )) s"
  python3 benches/e2e/recipe_rate.py --images /tmp/photos --packed /tmp/packed --threads 1,15 \
    --recipes rrc,full --batches 20 --device cuda --out "$out" 2>&1 | tail -12
  if [ -x .carry/bin/ringfeed-old ]; then
    # crop + resize + flip through the server before and after the op pipelines, same run.
    for bin in ringfeed-old ringfeed ringfeed-old ringfeed; do
      RINGFEED_BIN=$PWD/.carry/bin/$bin python3 benches/e2e/recipe_rate.py --images /tmp/photos --packed /tmp/packed \
        --threads 1,15 --recipes rrc --loaders ringfeed --batches 30 --device cuda --out "/tmp/speed-$bin" 2>&1 \
        | grep '^{' | sed "s/^/$bin /"
    done
  fi
  python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet50 \
    --loaders ceiling,ringfeed,dataloader-pil --recipe full --workers 15 --steps 100 --out "$out" 2>&1 | tail -8
  python3 -m pytest -q -p no:cacheprovider client-py/tests/test_cuda.py client-py/tests/test_ops.py 2>&1 | tail -4 | tee "$out/pytest-cuda.log"
  if [ -x .carry/bin/ops-bench ]; then
    .carry/bin/ops-bench --bench 2>&1 | grep -E "^ops/|time:" > "$out/ops-criterion.txt" || true
    cat "$out/ops-criterion.txt"
  fi
  ;;
accuracy)
  t0=$(date +%s)
  python3 .carry/datasets/make_learnable.py /tmp/learn --train-per-class 200 --val-per-class 50 >/dev/null
  "$RINGFEED_BIN" pack /tmp/learn/train /tmp/learn-packed --progress none --threads 16 | tail -1
  echo "data: $(( $(date +%s) - t0 )) s"
  python3 benches/e2e/accuracy.py --data /tmp/learn --packed /tmp/learn-packed --seeds 0,1,2 \
    --recipes rrc,full --epochs 5 --size 112 --workers 15 --out "$out" 2>&1 | tail -12
  ;;
esac
