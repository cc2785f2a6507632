#!/usr/bin/env bash
# This wave's other GPU runs, in one call (one H200, 16 cores), each a helper's benchmark:
#   token data: GPT-2-small and ~1B Llama fed by TokenLoader vs data on the GPU vs on-the-fly and
#     memmap DataLoaders (benches/e2e/gpt_train.py);
#   the tuner's signals: ResNet-18 with autotune, the split wait, busy and limit (gpu_train.py);
#   files in place: an image folder served in place vs packed (in_place.py).
# Needs .carry/bin/ringfeed and .carry/datasets/{make_photos,make_text}.py, carried with the call.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=$1
export RINGFEED_BIN=$PWD/.carry/bin/ringfeed PYTHONPATH=$PWD/client-py PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 .carry/datasets/make_text.py /tmp/text >/dev/null
python3 .carry/datasets/make_photos.py /tmp/photos --count 8000 >/dev/null
"$RINGFEED_BIN" pack /tmp/photos /tmp/packed --progress none --threads 16 --force | tail -1
echo "data: $(( $(date +%s) - t0 )) s"
timeout 240 python3 benches/e2e/gpt_train.py --corpus /tmp/text --bin "$RINGFEED_BIN" --models gpt2-small,llama-1b \
  --seq-len 1024 --batch-size 16 --steps 40 --workers 4 --out "$out/gpt" 2>&1 | tail -12 || echo "gpt_train: rc $?"
timeout 150 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
  --loaders ceiling,ringfeed --workers 15 --steps 300 --out "$out/signals" 2>&1 | tail -14 || echo "gpu_train: rc $?"
timeout 90 python3 benches/e2e/in_place.py --images /tmp/photos --packed /tmp/packed --threads 1,15 --batches 30 \
  --repeats 2 --out "$out/in_place" 2>&1 | tail -10 || echo "in_place: rc $?"
