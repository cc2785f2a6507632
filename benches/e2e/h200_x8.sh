#!/usr/bin/env bash
# Issue 16 on nvidia-h200-x8 (or -x4: NPROC=4): one sidecar feeding every GPU of the node, DDP
# ResNet-50 and ResNet-18 (benches/e2e/ddp_train.py), in few calls:
#   setup    .carry/{bin,wheels,datasets}: nvImageCodec into /tmp/nv, the corpus (COUNT photos,
#            default 40,000: an epoch of 8 ranks x 256 is then 19 steps) packed once, and the
#            hybrid and CUDA tests on one GPU.
#   piece N  .carry/daliN: one piece of the stripped DALI package (h200_hybrid.sh has the same).
#   r50      ResNet-50: ceiling, ringfeed, dataloader-pil, dali (if unpacked), ringfeed-hybrid.
#   r18      ResNet-18: the same.
# Results into $OUT/<step>/ddp.{json,md}; commit them under benches/results/<date>-h200-x8/.
set -euo pipefail
cd "$(dirname "$0")/../.."
step=$1
out=${OUT:-/tmp/out}
nproc=${NPROC:-$(nvidia-smi -L | wc -l)}
mkdir -p /tmp/rf
export RINGFEED_BIN=/tmp/rf/ringfeed PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/dalipkg:/tmp/nv:/tmp/dalideps:$PWD/client-py
export LD_LIBRARY_PATH=/tmp/dalipkg/nvidia/nvimgcodec:/tmp/dalipkg/nvidia/cu13/lib:/tmp/nv/nvidia/nvimgcodec:/tmp/nv/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
loaders() {
  local l="ceiling,ringfeed,dataloader-pil"
  [ -d /tmp/dalipkg/nvidia/dali ] && l="$l,dali"
  python3 -c "import nvidia.nvimgcodec" 2>/dev/null && l="$l,ringfeed-hybrid"
  echo "$l"
}
case $step in
setup)
  cp .carry/bin/ringfeed /tmp/rf/ringfeed
  pip install -q --no-deps --target /tmp/nv .carry/wheels/nvidia_nvimgcodec*.whl .carry/wheels/nvidia_nvjpeg*.whl
  pip install -q --no-deps --target /tmp/dalideps $(ls .carry/wheels/*.whl | grep -v nvidia_) 2>/dev/null || true
  t0=$(date +%s)
  python3 .carry/datasets/make_photos.py /tmp/photos --count "${COUNT:-40000}" --jobs "$(nproc)" >/dev/null
  "$RINGFEED_BIN" pack /tmp/photos /tmp/packed --progress none --force | tail -1
  echo "data: $(( $(date +%s) - t0 )) s; $nproc GPUs; $(nproc) cores"
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider client-py/tests/test_hybrid.py client-py/tests/test_cuda.py 2>&1 | tail -5 || echo "pytest rc $?"
  ;;
piece*)
  n=${step#piece}
  mkdir -p /tmp/dali && cp .carry/dali$n/* /tmp/dali/
  if [ -f /tmp/dali/dali.md5 ] && [ "$(ls /tmp/dali/piece0* | wc -l)" -ge 3 ] && [ ! -d /tmp/dalipkg/nvidia/dali ]; then
    cat /tmp/dali/piece0* > /tmp/dali.tar.xz
    (cd /tmp && echo "$(cut -d' ' -f1 dali/dali.md5)  dali.tar.xz" | md5sum -c -)
    mkdir -p /tmp/dalipkg && tar -C /tmp/dalipkg -xJf /tmp/dali.tar.xz
  fi
  ls /tmp/dali
  ;;
r50 | r18)
  model=$([ "$step" = r50 ] && echo resnet50 || echo resnet18)
  mkdir -p "$out/$step"
  timeout 560 python3 benches/e2e/ddp_train.py --images /tmp/photos --packed /tmp/packed --nproc "$nproc" \
    --models "$model" --loaders "${LOADERS:-$(loaders)}" --steps "${STEPS:-150}" --warmup 30 --workers 15 \
    --timeout 200 --out "$out/$step" 2>&1 | grep -v "^{" | tail -25 || echo "$step rc $?"
  ;;
*)
  echo "unknown step $step" >&2; exit 2
  ;;
esac
