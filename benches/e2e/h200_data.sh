#!/usr/bin/env bash
# The GPU runs of token data (issue 13) and remote data (issue 15), one H200, in two calls:
#   gpt     GPT-2-small and ~1B Llama fed by TokenLoader (autotuned: it should settle at one
#           thread) vs data on the GPU vs on-the-fly and memmap DataLoaders (gpt_train.py).
#   remote  ResNet-50 fed from s3://bucket/rf on a local s3s-fs, cold cache then warm
#           (remote_train.py), and the feed-only remote.py for ringfeed.
# Needs .carry/bin/ringfeed, .carry/bin/s3s-fs (strip --strip-debug of ~/.cargo/bin/s3s-fs) and
# .carry/datasets/{make_photos,make_text}.py. Results into $OUT/<step>.
set -euo pipefail
cd "$(dirname "$0")/../.."
step=$1
out=${OUT:-/tmp/out}
export RINGFEED_BIN=$PWD/.carry/bin/ringfeed PYTHONPATH=$PWD/client-py PYTHONUNBUFFERED=1
mkdir -p "$out"
case $step in
gpt)
  python3 .carry/datasets/make_text.py /tmp/text >/dev/null
  timeout 420 python3 benches/e2e/gpt_train.py --corpus /tmp/text --bin "$RINGFEED_BIN" --models gpt2-small,llama-1b \
    --seq-len 1024 --batch-size 16 --steps 60 --workers 4 --out "$out/gpt" 2>&1 | tail -16 || echo "gpt_train: rc $?"
  ;;
remote)
  python3 .carry/datasets/make_photos.py /tmp/photos --count 8000 >/dev/null
  timeout 360 python3 benches/e2e/remote_train.py --images /tmp/photos --s3s-fs .carry/bin/s3s-fs --models resnet50 \
    --steps 150 --out "$out/remote" 2>&1 | grep -v "^{" | tail -12 || echo "remote_train: rc $?"
  timeout 150 python3 benches/e2e/remote.py --images /tmp/photos --out "$out/remote-feed" --s3s-fs .carry/bin/s3s-fs \
    --mbps 400 --threads 15 --batch-size 256 --only ringfeed 2>&1 | tail -8 || echo "remote.py: rc $?"
  ;;
*)
  echo "unknown step $step" >&2; exit 2
  ;;
esac
