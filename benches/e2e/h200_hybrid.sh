#!/usr/bin/env bash
# Hybrid decode on the GPU machine (one H200, 16 cores), in the few calls a lease allows:
#   setup   .carry/{bin,wheels,datasets}: installs nvImageCodec (+ nvJPEG) and DALI's Python
#           needs into /tmp, makes the corpus (8,000 ImageNet-like photos) and 2,000 photos of
#           1.5-3 MP, packs both, and runs the hybrid and CUDA tests with the GPU decoders.
#   piece N .carry/daliN: one piece of the stripped DALI package (research/gpu-machine-peers.md).
#   feed    unpacks DALI, then benches/e2e/hybrid_feed.py (no model) at 6 and 15 threads.
#   gt      NAME "ARGS" ...: benches/e2e/gpu_train.py with each ARGS (and --warmup-s 12) into $OUT/NAME
#   train   benches/e2e/gpu_train.py: ResNet-18 at 6 and 15 threads, ResNet-50 at 15, fed by
#           ringfeed (CPU only), ringfeed with hybrid decode, and DALI, against the ceiling.
#   kernel  the Triton finishing kernel (RINGFEED_GPU_FINISH=triton) against the matrix products:
#           tests, feed rate and ResNet-18 on 6 threads (no DALI needed).
#   step    what each part of the client's GPU work (host side, hardware or CUDA decode, the kernel)
#           costs ResNet-18's step, each beside the model in a thread of its own (hybrid_step.py).
#   final   after setup and piece1..3: ResNet-18 on 6 and 15 threads, ResNet-50 on 3, and the feed
#           rate at 6 threads, each beside DALI in the same call.
#   final2  piece3, then ResNet-18 on 6 and 15 threads and ResNet-50 on 3 beside DALI (at most 8
#           files come back from a call).
#   final3  piece3, then every row of issue 11 beside DALI in one call: ResNet-18 on 6 threads
#           (pinned 0.625, autotuned, autotuned with 12 slots), ResNet-50 on 3, the feed at 15
#           threads (train and eval transforms, both corpora), ResNet-18 on 15 (CPU only,
#           autotuned, autotuned with 12 slots). At most 8 files come back: no server logs.
#           FINAL_PARTS=train or feed runs one half (a call may run 600 s; both take about 660).
#   settled after setup and piece1..2, carrying dali3: final3's training rows with every loader warmed
#           up for at least 10 s (the autotuner settled), beside DALI.
#   nvjpeg  nvJPEG's batched hardware decoder against nvImageCodec's per-image decode: GPU tests,
#           the step cost (hybrid_step.py) and ResNet-18 on 6 threads (no DALI needed).
#   trace   ResNet-18 on 6 threads, alone and fed by ringfeed (CPU, pinned share), each run followed
#           by 30 steps under torch.profiler (gpu_train.py --trace; trace_summary.py reads them).
#   probe   the GPU tests, then the client's GPU work alone on an idle GPU (nvjpeg_probe.py: nvJPEG's
#           decode per output format, the finishing kernel) and beside the model (hybrid_step.py).
#   fidelity  replicated against interpolated chroma on COUNT photos of the corpus, full size and
#           finished, against Pillow and torchvision (chroma_fidelity.py).
#   rebuild RINGFEED_GPU_CHROMA=rebuild, in one call: the GPU tests' PSNRs, the rebuild kernels alone
#           (chroma_kernel_probe.py), the corpus PSNR of the three modes (chroma_fidelity.py), the
#           cost beside the model (hybrid_step.py), ResNet-18 on 6 threads with replicated and
#           rebuilt chroma (needs the binary of protocol 1.4: 1.3 says no chroma).
#   tiled   the tiled finishing kernel against the direct one, and the chroma rebuild: GPU tests,
#           both kernels alone and beside the model, the corpus PSNR of the chroma modes,
#           ResNet-18 on 6 threads (pinned 0.625 and 0.75, autotuned).
#   threads ResNet-18 on 6 threads at a share of 0.75 with 2, 3 and 4 GPU decode threads, 6 and 10
#           slots: whether the decode threads are what holds the GPU path back.
#   nv12    nvJPEG's NV12 output (4:2:0): whether the batched hardware decoder takes it, and its kernels and copies (nvjpeg_probe.py --nv12).
#   kinds   what kind of work beside ResNet-18 costs its step (hybrid_step.py's probes), then
#           ResNet-18 on 6 threads, pinned 0.625 and 0.75 and autotuned.
#   pin     the CPU topology, then ResNet-18 fed by ringfeed with the sidecar's threads floating and
#           with the sidecar and the training process on disjoint cores.
#   contend ResNet-18 at 0.75 with nvJPEG's pipelining off, and with blocking host waits.
#   process nvJPEG's decode beside ResNet-18 from a thread of the training process and from a process
#           of its own (hybrid_step.py's decode-nvjpeg@process).
#   launch  host time per kernel launch beside each kind of CUDA call, and beside nvJPEG (launch_probe.py).
#   charts  after setup (PIECE=1) and piece2 (this call carries .carry/dali3): the README's
#           TrivialAugment panels, ResNet-18 on 6 and 15 threads and ResNet-50 on 15, ringfeed,
#           DALI (trivial_augment_wide) and a DataLoader + torchvision v2; CHART_PARTS=r18 or r50.
#   ops27   issue 27, protocol 1.8 (per-image ops on the GPU): after setup (PIECE=1; TESTS with
#           test_gpu_ops.py) and piece2, the first call carrying .carry/dali3. OPS_PARTS=feed: the
#           feed rate (no model) of the plain, TrivialAugmentWide, RandAugment(2, 9) and AutoAugment
#           recipes at 6 and 15 threads, ringfeed autotuned (hybrid) and CPU only, beside DALI's own
#           policies; OPS_PARTS=train: ResNet-18 on 6 and 15 threads and ResNet-50 on 6 with ta_wide's
#           recipe (RRC + flip + TA + erasing), ringfeed hybrid (autotuned) and CPU only, DALI and the
#           ceiling, every loader warmed up 12 s.
#   accuracy27  issue 27's accuracy rows (after setup; no DALI needed): ResNet-18 on
#           make_learnable.py --grid 3, ta_wide's recipe with MixUp/CutMix, fed by ringfeed with hybrid
#           decode autotuned, with the share pinned at 0.5, on the host only, and by a DataLoader +
#           torchvision v2; SEEDS (default 0,1,2,3,4; split over calls if one runs past 600 s).
#   tuned   after setup and the DALI pieces: ResNet-18 on 6 and 15 threads fed by ringfeed with the
#           autotuned share (Triton kernel, the tuner judging by time per batch), a pinned 0.75,
#           and DALI; the feed rate on both corpora at 6 threads against DALI.
#   clip29  issue 29 in one call of its own (no setup or DALI needed; about 5 minutes): the CLIP-style
#           model of benches/clip_train.py (ViT-Tiny/16 + a 4-layer text tower, 224 px, batch 512,
#           bf16) on 4,000 LAION-like samples (benches/make_laion.py), fed by ringfeed (captions
#           tokenised in the server, hybrid decode autotuned) and by webdataset + DataLoader + PIL + the
#           HF tokenizer, at 6 and 15 threads, against its ceiling in the same process. Carries
#           .carry/clip (webdataset, braceexpand, pyyaml and tokenizers wheels for Python 3.12),
#           .carry/bin (ringfeed or ringfeed.xz, a build with protocol 1.9) and .carry/wheels (nvJPEG).
#   det30   issue 30 in one call of its own (no setup, DALI or extra wheel needed; about 7 minutes):
#           benches/det_train.py on COUNT (default 2000) COCO-style images of benches/make_coco.py
#           (objects drawn on setup's /tmp/photos where this machine has them, else on photos made
#           here), packed with `--coco --masks`: RetinaNet (ResNet-50 FPN, 640 px, bf16, the largest
#           batch from 32 that fits) fed by ringfeed and by a DataLoader + torchvision v2 (the
#           references' large-scale jitter), at 6 and 15 threads, against its ceiling in the same
#           process; then DeepLabv3 (ResNet-50) the same way where DET_SEG is not 0. Carries
#           .carry/bin (ringfeed or ringfeed.xz, a build with protocol 1.10: targets). DET_MODELS
#           (default retinanet; or fasterrcnn), DET_THREADS (6,15), DET_ARGS: more det_train.py flags.
# The carried wheels may come split over calls (64 MiB a call): setup installs the nvidia_ ones
# it finds, setup or piece1 the others (DALI's Python needs).
set -euo pipefail
cd "$(dirname "$0")/../.."
deps() {  # DALI's Python needs, where this call carries them
  local w
  w=$(ls .carry/wheels/*.whl 2>/dev/null | grep -v nvidia_ || true)
  [ -z "$w" ] || pip install -q --no-deps --target /tmp/dalideps $w
}
dali_unpack() {
  if [ ! -d /tmp/dalipkg/nvidia/dali ]; then
    cat /tmp/dali/piece0* > /tmp/dali.tar.xz
    (cd /tmp && md5sum -c dali/dali.md5 2>/dev/null || (cd /tmp && echo "$(cut -d' ' -f1 dali/dali.md5)  dali.tar.xz" | md5sum -c -))
    mkdir -p /tmp/dalipkg && tar -C /tmp/dalipkg -xJf /tmp/dali.tar.xz
  fi
  python3 -c "import nvidia.dali as d; print('dali', d.__version__)"
}
gpu_prep() {  # the carried binary, nvImageCodec + nvJPEG, and the corpus ($1 photos) packed, where absent
  [ ! -f .carry/bin/ringfeed ] || cp .carry/bin/ringfeed /tmp/rf/ringfeed
  [ -d /tmp/nv/nvidia ] || pip install -q --no-deps --target /tmp/nv .carry/wheels/nvidia_nvimgcodec*.whl .carry/wheels/nvidia_nvjpeg*.whl 2>/dev/null
  if [ ! -d /tmp/packed ]; then
    python3 benches/make_photos.py /tmp/photos --count "$1" >/dev/null
    "$RINGFEED_BIN" pack /tmp/photos /tmp/packed --threads 16 --progress none --force | tail -1
  fi
}
step=$1
out=${OUT:-/tmp/out}
mkdir -p /tmp/rf
export RINGFEED_BIN=/tmp/rf/ringfeed PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/dalipkg:/tmp/nv:/tmp/dalideps:$PWD/client-py
export LD_LIBRARY_PATH=/tmp/dalipkg/nvidia/nvimgcodec:/tmp/dalipkg/nvidia/cu13/lib:/tmp/nv/nvidia/nvimgcodec:/tmp/nv/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
case $step in
setup)
  cp .carry/bin/ringfeed /tmp/rf/ringfeed
  # nvJPEG's wheel at least (the Finisher's direct decoder); nvImageCodec's where carried.
  # nvImageCodec's wheel where carried (.carry/nvimg: 25 MB, a call of its own beside the DALI
  # pieces); installed here, in one go with nvJPEG's: pip --target skips a top-level `nvidia/`
  # that already exists, and DALI's package has an `nvidia/nvimgcodec/` of libraries only.
  pip install -q --no-deps --target /tmp/nv .carry/wheels/nvidia_*.whl $(ls .carry/nvimg/*.whl 2>/dev/null)
  [ -z "${PIECE:-}" ] || { mkdir -p /tmp/dali && cp .carry/dali"$PIECE"/* /tmp/dali/; }
  deps
  [ ! -d /tmp/nv/nvidia/nvimgcodec ] || python3 - <<'PY'
from nvidia import nvimgcodec
print("nvimgcodec", getattr(nvimgcodec, "__version__", "?"))
print((nvimgcodec.Decoder.__init__.__doc__ or "")[:1500])
print((nvimgcodec.Decoder.decode.__doc__ or "")[:1500])
PY
  t0=$(date +%s)
  ( python3 benches/make_photos.py /tmp/photos --count 8000 >/dev/null
    "$RINGFEED_BIN" pack /tmp/photos /tmp/packed --threads 16 --progress none --force | tail -1
    python3 benches/e2e/hybrid_feed.py --make-big /tmp/photos /tmp/big --count 2000
    "$RINGFEED_BIN" pack /tmp/big /tmp/bigpacked --threads 16 --progress none --force | tail -1
    echo "data: $(( $(date +%s) - t0 )) s" ) > /tmp/data.log 2>&1 &
  [ -n "${SKIPTESTS:-}" ] || timeout 300 python3 -m pytest -q -s -p no:cacheprovider ${TESTS:-client-py/tests/test_nvjpeg.py client-py/tests/test_hybrid.py client-py/tests/test_cuda.py client-py/tests/test_finish_kernel.py} 2>&1 | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" | grep "PSNR\|downscale\|passed\|failed\|FAILED\|Error" | tail -40 || echo "pytest rc $?"
  wait
  cat /tmp/data.log
  if [ -n "${QUICK:-}" ]; then
    mkdir -p "$out"
    timeout 100 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
      --loaders ceiling,ringfeed-share-0.75 --workers 15 --threads-cap 6 --steps 400 --out "$out/quick" 2>&1 \
      | grep -v "^{" | sed -n 5,9p || echo "quick rc $?"
  fi
  ;;
piece*)
  n=${step#piece}
  mkdir -p /tmp/dali && cp .carry/dali$n/* /tmp/dali/ && ls -la /tmp/dali
  deps
  ;;
feed)
  dali_unpack
  mkdir -p "$out"
  timeout 420 python3 benches/e2e/hybrid_feed.py --images /tmp/photos --packed /tmp/packed \
    --big-images /tmp/big --big-packed /tmp/bigpacked --threads 6,15 --batches 40 --out "$out/feed" 2>&1 | tail -30 || echo "feed rc $?"
  ;;
profile)
  gpu_prep "${COUNT:-2000}"
  timeout 300 python3 benches/e2e/hybrid_profile.py --images /tmp/photos --packed /tmp/packed --threads ${THREADS:-6} 2>&1 | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" | tail -70
  ;;
train2)
  mkdir -p "$out"
  cp .carry/bin/ringfeed /tmp/rf/ringfeed
  timeout 280 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed-hybrid,ringfeed-share-0.5,ringfeed-share-0.625,ringfeed-share-0.75,dali --workers 15 --threads-cap 6 --steps 500 --out "$out/r18-6" 2>&1 | tail -24 || echo "r18-6 rc $?"
  timeout 200 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed,ringfeed-hybrid,ringfeed-share-0.25,dali --workers 15 --steps 400 --out "$out/r18-15" 2>&1 | tail -24 || echo "r18-15 rc $?"
  ;;
kernel)
  # The Triton finishing kernel against the matrix products: the CUDA tests with both, the feed
  # rate at 6 threads for pinned shares, and ResNet-18 on 6 threads with each.
  cp .carry/bin/ringfeed /tmp/rf/ringfeed
  pip install -q --no-deps --target /tmp/nv .carry/wheels/nvidia_nvimgcodec*.whl .carry/wheels/nvidia_nvjpeg*.whl 2>/dev/null
  ( python3 benches/make_photos.py /tmp/photos --count 8000 >/dev/null
    "$RINGFEED_BIN" pack /tmp/photos /tmp/packed --threads 16 --progress none --force | tail -1 ) > /tmp/data.log 2>&1 &
  timeout 200 python3 -m pytest -q -x -p no:cacheprovider client-py/tests/test_hybrid.py client-py/tests/test_finish_kernel.py 2>&1 | tail -8 || echo "pytest rc $?"
  wait; cat /tmp/data.log
  mkdir -p "$out"
  timeout 150 python3 benches/e2e/hybrid_feed.py --images /tmp/photos --packed /tmp/packed --threads 6 \
    --loaders hybrid,triton --shares 0.5,0.75 --batches 40 --out "$out/feed" 2>&1 | grep -v "^{" | tail -10 || echo "feed rc $?"
  for g in bmm triton; do
    RINGFEED_GPU_FINISH=$g timeout 120 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
      --loaders ceiling,ringfeed-share-0.625,ringfeed-hybrid --workers 15 --threads-cap 6 --steps 400 --out "$out/r18-6-$g" 2>&1 | grep -v "^{" | tail -8 || echo "r18-6-$g rc $?"
  done
  ;;
tuned)
  dali_unpack
  mkdir -p "$out"
  timeout 240 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed-hybrid,ringfeed-share-${SHARE:-0.75},dali --workers 15 --threads-cap 6 --steps 800 --out "$out/r18-6" 2>&1 | grep -v "^{" | tail -24 || echo "r18-6 rc $?"
  timeout 150 python3 benches/e2e/hybrid_feed.py --images /tmp/photos --packed /tmp/packed \
    --big-images /tmp/big --big-packed /tmp/bigpacked --threads 6 --loaders triton,dali --shares 0.5,0.75 \
    --batches 40 --out "$out/feed" 2>&1 | grep -v "^{" | tail -14 || echo "feed rc $?"
  timeout 170 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed,ringfeed-hybrid,dali --workers 15 --steps 600 --out "$out/r18-15" 2>&1 | grep -v "^{" | tail -24 || echo "r18-15 rc $?"
  ;;
step)
  # What each part of the client's GPU work costs the model's step (hybrid_step.py; no DALI).
  gpu_prep "${COUNT:-2000}"
  mkdir -p "$out"
  timeout 240 python3 benches/e2e/hybrid_step.py --packed /tmp/packed --out "$out/step" ${STEP_ARGS:-} 2>&1 | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" | tail -14
  ;;
final)
  # After setup and piece1..3 (this call carries .carry/dali3): every training and feed row of
  # issue 11 with DALI in the same run, the Finisher on nvJPEG's batched hardware decoder.
  dali_unpack
  mkdir -p "$out"
  timeout 150 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed-share-0.75,ringfeed-hybrid,dali --workers 15 --threads-cap 6 --steps 600 \
    --out "$out/r18-6" 2>&1 | grep -v "^{" | tail -18 || echo "r18-6 rc $?"
  timeout 130 python3 benches/e2e/hybrid_feed.py --images /tmp/photos --packed /tmp/packed \
    --big-images /tmp/big --big-packed /tmp/bigpacked --threads 6 --loaders triton,dali --shares 0.75,0.875 \
    --batches 40 --out "$out/feed" 2>&1 | grep -v "^{" | tail -12 || echo "feed rc $?"
  timeout 130 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed,ringfeed-hybrid,dali --workers 15 --steps 600 --out "$out/r18-15" 2>&1 \
    | grep -v "^{" | tail -18 || echo "r18-15 rc $?"
  timeout 110 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet50 \
    --loaders ceiling,ringfeed-hybrid,dali --workers 15 --threads-cap 3 --steps 200 --out "$out/r50-3" 2>&1 \
    | grep -v "^{" | tail -14 || echo "r50-3 rc $?"
  RINGFEED_GPU_DECODE_THREADS=1 timeout 60 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed \
    --models resnet18 --loaders ringfeed-share-0.75 --workers 15 --threads-cap 6 --steps 600 --out "$out/r18-6-1thread" \
    2>&1 | grep -v "^{" | sed -n 5,8p || echo "r18-6-1thread rc $?"
  ;;
final2)
  # piece3 and the rows issue 11's targets name, DALI in the same call: ResNet-18 on 6 threads
  # (pinned 0.625, autotuned), ResNet-50 on 3 threads, ResNet-18 on 15. At most 8 files come
  # back from a call: the servers' logs are left out.
  mkdir -p /tmp/dali && cp .carry/dali3/* /tmp/dali/
  dali_unpack
  mkdir -p "$out"
  timeout 150 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed-share-0.625,ringfeed-hybrid,dali --workers 15 --threads-cap 6 --steps 600 \
    --out "$out/r18-6" 2>&1 | grep -v "^{" | sed -n 5,10p || echo "r18-6 rc $?"
  timeout 120 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet50 \
    --loaders ceiling,ringfeed-hybrid,dali --workers 15 --threads-cap 3 --steps 200 --out "$out/r50-3" 2>&1 \
    | grep -v "^{" | sed -n 5,9p || echo "r50-3 rc $?"
  timeout 120 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed,ringfeed-hybrid,dali --workers 15 --steps 400 --out "$out/r18-15" 2>&1 \
    | grep -v "^{" | sed -n 5,10p || echo "r18-15 rc $?"
  rm -f "$out"/*/serve.log
  ;;
final3)
  [ ! -d .carry/dali3 ] || { mkdir -p /tmp/dali && cp .carry/dali3/* /tmp/dali/; }
  dali_unpack
  mkdir -p "$out"
  # One call may run 600 s: FINAL_PARTS=train (both models' rows) and FINAL_PARTS=feed (the feed
  # rows) split the step over two calls; by default it runs both.
  parts=${FINAL_PARTS:-train,feed}
  if [[ $parts == *train* ]]; then
  timeout 160 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed-share-0.625,ringfeed-hybrid,ringfeed-hybrid@slots12,dali --workers 15 --threads-cap 6 \
    --steps 400 --out "$out/r18-6" 2>&1 | grep -v "^{" | sed -n 5,11p || echo "r18-6 rc $?"
  timeout 110 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet50 \
    --loaders ceiling,ringfeed-hybrid,dali --workers 15 --threads-cap 3 --steps 200 --out "$out/r50-3" 2>&1 \
    | grep -v "^{" | sed -n 5,9p || echo "r50-3 rc $?"
  timeout 150 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed,ringfeed-hybrid,ringfeed-hybrid@slots12,dali --workers 15 --steps 400 --out "$out/r18-15" 2>&1 \
    | grep -v "^{" | sed -n 5,11p || echo "r18-15 rc $?"
  fi
  if [[ $parts == *feed* ]]; then
  # The autotuned share beside the pinned ones: on the large photos the engine, not the CPU, is
  # the limit at 0.75 (2026-12-01: 1.06x DALI there), so the best share may be lower.
  timeout 240 python3 benches/e2e/hybrid_feed.py --images /tmp/photos --packed /tmp/packed \
    --big-images /tmp/big --big-packed /tmp/bigpacked --threads 15 --loaders ${FEED_LOADERS:-ringfeed,triton,auto,dali} \
    --shares ${SHARES:-0.625,0.75} --transforms train,eval --batches 30 --out "$out/feed" 2>&1 | grep -v "^{" | tail -24 \
    || echo "feed rc $?"
  fi
  rm -f "$out"/*/serve.log
  ;;
settled)
  # As final3's training rows, every loader warmed up for at least 10 s (gpu_train.py --warmup-s)
  # so that the autotuner has settled before the timed steps: after setup and piece1..2 (this
  # call carries .carry/dali3).
  [ ! -d .carry/dali3 ] || { mkdir -p /tmp/dali && cp .carry/dali3/* /tmp/dali/; }
  dali_unpack
  mkdir -p "$out"
  timeout 170 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed-share-0.625,ringfeed-hybrid,dali --workers 15 --threads-cap 6 \
    --steps 400 --warmup-s 10 --out "$out/r18-6" 2>&1 | grep "^| resnet" || echo "r18-6 rc $?"
  timeout 130 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet50 \
    --loaders ceiling,ringfeed-hybrid,dali --workers 15 --threads-cap 3 --steps 200 --warmup-s 10 --out "$out/r50-3" 2>&1 \
    | grep "^| resnet" || echo "r50-3 rc $?"
  timeout 170 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed,ringfeed-hybrid,dali --workers 15 --steps 400 --warmup-s 10 --out "$out/r18-15" 2>&1 \
    | grep "^| resnet" || echo "r18-15 rc $?"
  rm -f "$out"/*/serve.log
  ;;
charts)
  # The README's TrivialAugment panels (benches/charts.py, TRAINING): the full recipe (RRC + flip +
  # TrivialAugmentWide + RandomErasing(0.25)) feeding ResNet-18 on 6 and 15 CPU threads
  # (CHART_PARTS=r18) and ResNet-50 on 15 (CHART_PARTS=r50), by ringfeed (CPU decode: hybrid
  # decode does not take this recipe yet), DALI (its own
  # trivial_augment_wide on the GPU, no erasing) and a DataLoader + torchvision v2, every loader
  # warmed up 12 s. After setup and piece1..2 (the first charts call carries .carry/dali3).
  [ ! -d .carry/dali3 ] || { mkdir -p /tmp/dali && cp .carry/dali3/* /tmp/dali/; }
  dali_unpack
  mkdir -p "$out"
  parts=${CHART_PARTS:-r18,r50}
  if [[ $parts == *r18* ]]; then
  timeout 250 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed,dali,dataloader-pil --recipe full --workers 6 --threads-cap 6 \
    --steps 200 --warmup-s 12 --out "$out/ta-r18-6" 2>&1 | grep "^| resnet\|reason\|Error" || echo "ta-r18-6 rc $?"
  timeout 250 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed,dali,dataloader-pil --recipe full --workers 15 \
    --steps 300 --warmup-s 12 --out "$out/ta-r18-15" 2>&1 | grep "^| resnet\|Error" || echo "ta-r18-15 rc $?"
  fi
  if [[ $parts == *r50* ]]; then
  timeout 250 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet50 \
    --loaders ceiling,ringfeed,dali,dataloader-pil --recipe full --workers 15 \
    --steps 150 --warmup-s 12 --out "$out/ta-r50-15" 2>&1 | grep "^| resnet\|Error" || echo "ta-r50-15 rc $?"
  fi
  rm -f "$out"/*/serve.log
  ;;
accuracy27)
  if [ ! -d /tmp/learn3-packed ]; then
    python3 benches/make_learnable.py /tmp/learn3 --grid 3 --train-per-class 200 --val-per-class 50 >/dev/null
    "$RINGFEED_BIN" pack /tmp/learn3/train /tmp/learn3-packed --progress none --threads 16 --force | tail -1
  fi
  mkdir -p "$out"
  timeout 560 python3 benches/e2e/accuracy.py --data /tmp/learn3 --packed /tmp/learn3-packed --seeds ${SEEDS:-0,1,2,3,4} \
    --recipes full --loaders ringfeed,ringfeed-share-0.5,ringfeed-host,dataloader --epochs 8 --lr 0.2 --size 112 \
    --workers 15 --out "$out/accuracy-$(echo ${SEEDS:-all} | tr , -)" 2>&1 | tail -12 || echo "accuracy rc $?"
  ;;
ops27)
  [ ! -d .carry/dali3 ] || { mkdir -p /tmp/dali && cp .carry/dali3/* /tmp/dali/; }
  dali_unpack
  mkdir -p "$out"
  parts=${OPS_PARTS:-feed,train}
  if [[ $parts == *feed* ]]; then
  timeout 420 python3 benches/e2e/hybrid_feed.py --images /tmp/photos --packed /tmp/packed \
    --transforms ${OPS_TRANSFORMS:-train,ta,ra,aa} --threads ${OPS_THREADS:-6,15} --loaders ringfeed,auto,dali \
    --batches 40 --settle 12 --out "$out/ops-feed" 2>&1 | grep -v "^{" | grep "^|\|Error\|error" | tail -40 || echo "ops-feed rc $?"
  fi
  if [[ $parts == *train* ]]; then
  timeout 200 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ${OPS_R18_6:-ceiling,ringfeed-hybrid,ringfeed-hybrid@torchops,dali} --recipe full --workers 6 --threads-cap 6 \
    --steps 300 --warmup-s 12 --out "$out/ta-r18-6" 2>&1 | grep "^| resnet\|reason\|Error" || echo "ta-r18-6 rc $?"
  timeout 150 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed-hybrid,dali --recipe full --workers 15 \
    --steps 300 --warmup-s 12 --out "$out/ta-r18-15" 2>&1 | grep "^| resnet\|Error" || echo "ta-r18-15 rc $?"
  timeout 200 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet50 \
    --loaders ceiling,ringfeed-hybrid,dali --recipe full --workers 6 --threads-cap 6 \
    --steps 150 --warmup-s 12 --out "$out/ta-r50-6" 2>&1 | grep "^| resnet\|Error" || echo "ta-r50-6 rc $?"
  fi
  rm -f "$out"/*/serve.log
  ;;
nvjpeg)
  # nvJPEG's batched hardware decoder (ringfeed.gpu.nvjpeg, one call a batch without the GIL) against
  # nvImageCodec's per-image Python decode: the GPU tests, what each costs ResNet-18's step, and
  # ResNet-18 on 6 threads with pinned and autotuned shares (no DALI needed).
  cp .carry/bin/ringfeed /tmp/rf/ringfeed
  [ -d /tmp/nv/nvidia ] || pip install -q --no-deps --target /tmp/nv .carry/wheels/nvidia_nvimgcodec*.whl .carry/wheels/nvidia_nvjpeg*.whl 2>/dev/null
  ( python3 benches/make_photos.py /tmp/photos --count 8000 >/dev/null
    "$RINGFEED_BIN" pack /tmp/photos /tmp/packed --threads 16 --progress none --force | tail -1 ) > /tmp/data.log 2>&1 &
  timeout 240 python3 -m pytest -q -p no:cacheprovider client-py/tests/test_nvjpeg.py client-py/tests/test_hybrid.py \
    client-py/tests/test_finish_kernel.py 2>&1 | tail -12 || echo "pytest rc $?"
  wait; cat /tmp/data.log
  mkdir -p "$out"
  timeout 150 python3 benches/e2e/hybrid_step.py --packed /tmp/packed --out "$out/step" \
    --parts alone,decode-hw,decode-nvjpeg,decode-nvjpeg+finish,finish,alone 2>&1 | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" | tail -10
  timeout 200 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed-share-0.625,ringfeed-share-0.75,ringfeed-hybrid --workers 15 --threads-cap 6 --steps 600 \
    --out "$out/r18-6" 2>&1 | grep -v "^{" | tail -16 || echo "r18-6 rc $?"
  RINGFEED_GPU_DECODER=nvimgcodec timeout 100 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed \
    --models resnet18 --loaders ceiling,ringfeed-share-0.625 --workers 15 --threads-cap 6 --steps 600 \
    --out "$out/r18-6-nvimgcodec" 2>&1 | grep -v "^{" | tail -8 || echo "r18-6-nvimgcodec rc $?"
  ;;
trace)
  # The real loop under torch.profiler (gpu_train.py --trace): ResNet-18 on 6 threads alone, fed
  # by ringfeed on the CPU and with a pinned share (benches/e2e/trace_summary.py reads the traces).
  gpu_prep "${COUNT:-8000}"
  mkdir -p "$out"
  timeout 200 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ${TRACE_LOADERS:-ceiling,ringfeed,ringfeed-share-${SHARE:-0.625}} --workers 15 --threads-cap 6 --steps 300 --trace 30 \
    --out "$out/trace" 2>&1 | grep -v "^{" | tail -16 || echo "trace rc $?"
  ;;
probe)
  gpu_prep "${COUNT:-2000}"
  mkdir -p "$out"
  timeout 200 python3 -m pytest -q -p no:cacheprovider client-py/tests/test_nvjpeg.py client-py/tests/test_hybrid.py \
    client-py/tests/test_finish_kernel.py 2>&1 | tail -8 || echo "pytest rc $?"
  timeout 120 python3 benches/e2e/nvjpeg_probe.py --packed /tmp/packed --out "$out/probe" 2>&1 | grep -v "^{" | tail -16 || echo "probe rc $?"
  timeout 120 python3 benches/e2e/hybrid_step.py --packed /tmp/packed --out "$out/step" \
    --parts ${PARTS:-alone,finish,decode-nvjpeg,decode-nvjpeg+finish,alone} 2>&1 | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" | tail -10
  ;;
fidelity)
  gpu_prep "${COUNT:-500}"
  mkdir -p "$out"
  timeout 100 python3 benches/e2e/chroma_fidelity.py --packed /tmp/packed --count 128 --out "$out/fidelity" 2>&1 \
    | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" | tail -6
  ;;
rebuild)
  gpu_prep "${COUNT:-8000}"
  mkdir -p "$out"
  timeout 200 python3 -m pytest -q -s -p no:cacheprovider client-py/tests/test_hybrid.py -k gpu_decoders 2>&1 \
    | grep "PSNR\|passed\|failed\|FAILED" | sort | uniq -c | tail -12 || echo "pytest rc $?"
  timeout 60 python3 benches/e2e/chroma_kernel_probe.py --count 192 --size 500x375 --out "$out/kernel" 2>&1 | tail -6
  timeout 100 python3 benches/e2e/chroma_fidelity.py --packed /tmp/packed --count 128 --out "$out/fidelity" 2>&1 \
    | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" | tail -6
  timeout 120 python3 benches/e2e/hybrid_step.py --packed /tmp/packed --out "$out/step" \
    --parts alone,decode-nvjpeg+finish,rebuild,decode-nvjpeg+rebuild+finish,alone 2>&1 \
    | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" | tail -8
  for c in replicate rebuild; do
    RINGFEED_GPU_CHROMA=$c timeout 100 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed \
      --models resnet18 --loaders ceiling,ringfeed-share-0.625 --workers 15 --threads-cap 6 --steps 400 \
      --out "/tmp/r18-$c" 2>&1 | grep -v "^{" | sed -n 5,8p || echo "r18-6-$c rc $?"
    mkdir -p "$out/r18-6-$c" && cp "/tmp/r18-$c/gpu.md" "$out/r18-6-$c/"
  done
  ;;
tiled)
  # The tiled finishing kernel (tensor-core products) against the direct one of 970c170, and
  # the chroma rebuild, in one call: GPU tests (PSNRs), both kernels alone and their pixels
  # (nvjpeg_probe.py --compare), each beside the model (hybrid_step.py), the corpus PSNR of the
  # chroma modes, ResNet-18 on 6 threads at pinned shares and autotuned.
  gpu_prep "${COUNT:-8000}"
  mkdir -p "$out"
  timeout 90 python3 benches/e2e/nvjpeg_open_probe.py --out "$out/open" 2>&1 | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" | tail -6 || echo "open probe rc $?"
  timeout 200 python3 -m pytest -v -s -p no:cacheprovider ${TESTS:-client-py/tests/test_nvjpeg.py client-py/tests/test_hybrid.py \
    client-py/tests/test_cuda.py client-py/tests/test_finish_kernel.py} 2>&1 | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" \
    > "$out/tests.log" || echo "pytest rc $?"
  grep "PSNR\|passed\|failed\|FAILED\|Error\|WARNING" "$out/tests.log" | tail -30
  timeout 90 python3 benches/e2e/nvjpeg_probe.py --packed /tmp/packed --batches 3 --kernels-only --compare _finish_kernel_before \
    --out "$out/probe" 2>&1 | grep -v "^{\|^\[" | tail -20 || echo "probe rc $?"
  timeout 120 python3 benches/e2e/hybrid_step.py --packed /tmp/packed --out "$out/step" --seconds 4 \
    --parts ${PARTS:-alone,finish,finish/before,decode-nvjpeg/replicated,decode-nvjpeg+finish,decode-nvjpeg+rebuild+finish,alone} 2>&1 \
    | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" | tail -10
  [ -n "${NOFID:-}" ] || timeout 60 python3 benches/e2e/chroma_fidelity.py --packed /tmp/packed --count 128 --out "$out/fidelity" 2>&1 \
    | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" | tail -8 || echo "fidelity rc $?"
  [ -n "${NOTRAIN:-}" ] || timeout 150 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ${LOADERS:-ceiling,ringfeed-share-0.625,ringfeed-share-0.75,ringfeed-hybrid} --workers 15 --threads-cap 6 --steps 400 \
    --out "$out/r18-6" 2>&1 | grep -v "^{" | tail -12 || echo "r18-6 rc $?"
  [ -z "${R15:-}" ] || timeout 150 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ringfeed,ringfeed-hybrid --workers 15 --steps 400 --out "$out/r18-15" 2>&1 | grep -v "^{" | tail -12 || echo "r18-15 rc $?"
  ;;
threads)
  # Whether the GPU path's decode threads hold ResNet-18 back at a share of 0.75 (6 CPU threads;
  # 2026-12-02: "latency, every slot in flight" there, 81-82 %): 2, 3 and 4 decode threads (the
  # loader takes as many batches ahead), 6 and 10 slots; gpu_train.py's table shows the loop's
  # wait for those decodes ("of it for GPU decodes").
  gpu_prep "${COUNT:-8000}"
  mkdir -p "$out"
  for t in ${DECODE_THREADS:-2 3 4}; do
    RINGFEED_GPU_DECODE_THREADS=$t timeout 170 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed \
      --models resnet18 --loaders ${LOADERS:-ringfeed-share-0.75,ringfeed-share-0.75@slots10,ringfeed-hybrid@slots10} \
      --workers 15 --threads-cap 6 --steps 400 --out "$out/r18-6-t$t" 2>&1 | grep -v "^{" | sed -n 5,24p || echo "t$t rc $?"
    rm -f "$out/r18-6-t$t/serve.log"
  done
  ;;
nv12)
  # Whether nvJPEG's NV12 output lets the engine write 4:2:0 images without its per-image
  # RGBA-to-RGB kernels: the probe's rows on an idle GPU (kernels and copies by name).
  # 2026-12-02: the batched hardware decoder refused NV12
  # (status 6, "execution failed"), so the hybrid_step.py parts this step ran then are gone.
  gpu_prep "${COUNT:-2000}"
  mkdir -p "$out"
  timeout 150 python3 benches/e2e/nvjpeg_probe.py --packed /tmp/packed --batches 5 --nv12 --out "$out/probe" 2>&1 \
    | grep -v "^\[" | cut -c1-900 | tail -14 || echo "probe rc $?"
  if [ -n "${TESTS:-}" ]; then
    timeout 240 python3 -m pytest -q -s -p no:cacheprovider $TESTS 2>&1 | grep -v "nvjpeg2k\|nvTIFF\|nvtiff\|nvJPEG2000" \
      | tee "$out/tests.log" | grep "PSNR\|passed\|failed\|FAILED\|Error" | tail -30 || echo "pytest rc $?"
  fi
  ;;
kinds)
  # What kind of work beside ResNet-18 costs its step (hybrid_step.py's probes: pure Python, 192
  # tiny kernels or copies a batch from Python or from a CUDA graph, against nvJPEG's decode),
  # then ResNet-18 on 6 threads (pinned 0.625 and 0.75, autotuned).
  gpu_prep "${COUNT:-8000}"
  mkdir -p "$out"
  timeout 200 python3 benches/e2e/hybrid_step.py --packed /tmp/packed --seconds 5 \
    --parts ${PARTS:-alone,py-2ms,kernels192,kernels192@graph,copies192,copies192@graph,decode-nvjpeg/replicated,alone} \
    --out "$out/step" 2>&1 | grep -v "^{" | tail -14 || echo "step rc $?"
  timeout 240 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ${LOADERS:-ceiling,ringfeed-share-0.625,ringfeed-share-0.75,ringfeed-hybrid} --workers 15 --threads-cap 6 \
    --steps 400 --out "$out/r18-6" 2>&1 | grep -v "^{" | sed -n 5,24p || echo "r18-6 rc $?"
  rm -f "$out/r18-6/serve.log"
  ;;
pin)
  # Whether the decode threads slow the training process's own host threads (hyperthread
  # siblings, shared cores): the topology, then ResNet-18 fed by ringfeed with the sidecar's
  # threads left to float and with the sidecar and the training process on disjoint cores (the
  # trainer on the first two physical cores and their siblings).
  gpu_prep "${COUNT:-8000}"
  mkdir -p "$out"
  lscpu | grep -i "model name\|^CPU(s)\|thread\|core\|socket\|numa" | tee "$out/lscpu.txt"
  trainer=$(python3 -c "
import glob
sib = sorted({open(f).read().strip() for f in glob.glob('/sys/devices/system/cpu/cpu*/topology/thread_siblings_list')},
             key=lambda s: int(s.replace('-', ',').split(',')[0]))
print(','.join(sib[:${TRAINER_CORES:-2}]))")
  rest=$(python3 -c "
t = set()
for part in '$trainer'.split(','):
    a, _, b = part.partition('-')
    t |= set(range(int(a), int(b or a) + 1))
import os
print(','.join(str(c) for c in sorted(os.sched_getaffinity(0) - t)))")
  echo "trainer cpus $trainer, sidecar cpus $rest" | tee -a "$out/lscpu.txt"
  printf '#!/bin/sh\nexec taskset -c %s /tmp/rf/ringfeed "$@"\n' "$rest" > /tmp/rf/pinned && chmod +x /tmp/rf/pinned
  train() {  # name, cap, loaders, pinned?
    if [ -n "${4:-}" ]; then
      RINGFEED_BIN=/tmp/rf/pinned timeout 150 taskset -c "$trainer" python3 benches/e2e/gpu_train.py --images /tmp/photos \
        --packed /tmp/packed --models resnet18 --loaders "$3" --workers 15 --threads-cap "$2" --steps 400 --out "$out/$1" 2>&1 \
        | grep "^| resnet18" | head -4 || echo "$1 rc $?"
    else
      timeout 150 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
        --loaders "$3" --workers 15 --threads-cap "$2" --steps 400 --out "$out/$1" 2>&1 | grep "^| resnet18" | head -4 || echo "$1 rc $?"
    fi
    rm -f "$out/$1/serve.log"
  }
  train free15 15 ceiling,ringfeed
  train free12 12 ringfeed
  train pin12 12 ringfeed 1
  train pin6 6 ringfeed-share-0.625 1
  ;;
contend)
  # The trace of 2026-12-02 (2026-12-02-h200-kinds/trace): beside nvJPEG's decode threads the
  # training thread's launches took 28 µs instead of 10.5. ResNet-18 on 6 threads at a share of
  # 0.75 with 10 slots: as is, with nvJPEG's hardware pipelining off (RINGFEED_NVJPEG_PIPELINE=0),
  # with every host wait of the process blocking (BENCH_BLOCKING_SYNC=1); CPU decode alone.
  gpu_prep "${COUNT:-8000}"
  mkdir -p "$out"
  run6() {  # name, loaders, env...
    local name=$1 loaders=$2
    shift 2
    env "$@" timeout 150 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
      --loaders "$loaders" --workers 15 --threads-cap 6 --steps 400 --out "$out/$name" 2>&1 \
      | grep "^| resnet18\|last change\|cudaSetDeviceFlags" || echo "$name rc $?"
    rm -f "$out/$name/serve.log"
  }
  run6 base ceiling,ringfeed-share-0.75@slots10 X=1
  run6 nopipe ringfeed-share-0.75@slots10 RINGFEED_NVJPEG_PIPELINE=0
  run6 blocking ceiling,ringfeed-share-0.75@slots10 BENCH_BLOCKING_SYNC=1
  ;;
process)
  # Whether nvJPEG's decode slows ResNet-18's step less from a process of its own (its own CUDA
  # context) than from a thread of the training process (2026-12-02: the training thread's
  # launches took 28 µs instead of 10.5 beside the decode threads): hybrid_step.py, each twice.
  gpu_prep "${COUNT:-2000}"
  mkdir -p "$out"
  timeout 240 python3 benches/e2e/hybrid_step.py --packed /tmp/packed --seconds 6 \
    --parts ${PARTS:-alone,decode-nvjpeg/replicated,decode-nvjpeg@process,decode-nvjpeg/replicated,decode-nvjpeg@process,alone} \
    --out "$out/step" 2>&1 | grep -v "^{" | tail -14 || echo "step rc $?"
  ;;
launch)
  # What the training thread's launches wait on beside hybrid decode (2026-12-02: 28 µs a launch
  # instead of 10.5 beside nvJPEG's decode threads): launch_probe.py times tiny launches, from C
  # and from Python, beside one kind of CUDA call at a time in another thread, and beside nvJPEG.
  # (Written 2026-12-02 without device time left to run it.)
  gpu_prep "${COUNT:-400}"
  mkdir -p "$out"
  timeout 200 python3 benches/e2e/launch_probe.py --packed /tmp/packed --out "$out/launch" 2>&1 \
    | grep -v "^{" | tail -16 || echo "launch rc $?"
  ;;
quick)
  cp .carry/bin/ringfeed /tmp/rf/ringfeed
  pip install -q --no-deps --target /tmp/nv .carry/wheels/nvidia_nvimgcodec*.whl .carry/wheels/nvidia_nvjpeg*.whl 2>/dev/null
  python3 benches/make_photos.py /tmp/photos --count 8000 >/dev/null
  "$RINGFEED_BIN" pack /tmp/photos /tmp/packed --threads 16 --progress none --force | tail -1
  mkdir -p "$out"
  timeout 150 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed-hybrid --workers 15 --threads-cap 6 --steps 800 --out "$out/r18-6" 2>&1 | grep -v "^{" | tail -16 || echo "r18-6 rc $?"
  timeout 150 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ringfeed,ringfeed-hybrid --workers 15 --steps 600 --out "$out/r18-15" 2>&1 | grep -v "^{" | tail -16 || echo "r18-15 rc $?"
  ;;
clip29)
  # Issue 29's GPU row: the CLIP-style model fed by ringfeed and by the webdataset + DataLoader
  # pipeline such users run, at 6 and 15 threads, against its ceiling, in one process. Each run
  # warms up 12 s, then times at least 20 steps and 15 s. COUNT (default 4000) samples; photos
  # from setup's /tmp/photos when this machine has them, else made here. CLIP_ARGS: more flags
  # for clip_train.py (later ones win, e.g. "--steps 40").
  if [ -f .carry/bin/ringfeed.xz ]; then xz -dc .carry/bin/ringfeed.xz > /tmp/rf/ringfeed && chmod +x /tmp/rf/ringfeed
  elif [ -f .carry/bin/ringfeed ]; then cp .carry/bin/ringfeed /tmp/rf/ringfeed; fi
  "$RINGFEED_BIN" --version
  [ -d /tmp/nv/nvidia ] || pip install -q --no-deps --target /tmp/nv .carry/wheels/nvidia_nvjpeg*.whl \
    $(ls .carry/nvimg/*.whl 2>/dev/null) || echo "no nvJPEG wheel: hybrid decode falls back to torchvision's decoder"
  [ -d /tmp/clipdeps/webdataset ] || pip install -q --no-deps --target /tmp/clipdeps .carry/clip/*.whl
  export PYTHONPATH=$PYTHONPATH:/tmp/clipdeps
  mkdir -p "$out/clip"
  if [ ! -f /tmp/laion/laion.json ]; then
    t0=$(date +%s)
    photos=()
    [ ! -f /tmp/photos/manifest.tsv ] || photos=(--photos /tmp/photos)
    timeout 120 python3 benches/make_laion.py /tmp/laion --count "${COUNT:-4000}" "${photos[@]}" || echo "make_laion rc $?"
    echo "data: $(( $(date +%s) - t0 )) s"
  fi
  timeout 330 python3 benches/clip_train.py --data /tmp/laion --loaders ceiling,ringfeed,dataloader \
    --threads "${CLIP_THREADS:-6,15}" --batch 512 --steps 20 --seconds 15 --warmup-s 12 --out "$out/clip" ${CLIP_ARGS:-} 2>&1 \
    | tee "$out/clip/clip.log" | grep -v "^{" | tail -24 || echo "clip rc $?"
  ;;
det30)
  # Issue 30's GPU row: a detection model (and DeepLabv3) fed by ringfeed and by the DataLoader +
  # torchvision v2 recipe of torchvision's references, at 6 and 15 threads, against its ceiling.
  # Each run warms up 12 s, then times at least 20 steps and 12 s.
  if [ -f .carry/bin/ringfeed.xz ]; then xz -dc .carry/bin/ringfeed.xz > /tmp/rf/ringfeed && chmod +x /tmp/rf/ringfeed
  elif [ -f .carry/bin/ringfeed ]; then cp .carry/bin/ringfeed /tmp/rf/ringfeed; fi
  "$RINGFEED_BIN" --version
  # (Read whole before grep: `grep -q` closing the pipe early would fail it under pipefail.)
  packhelp=$("$RINGFEED_BIN" pack --help 2>&1 || true)
  grep -q -- --coco <<<"$packhelp" || { echo "the carried ringfeed has no pack --coco: build it from a branch with protocol 1.10"; exit 1; }
  mkdir -p "$out/det"
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  if [ ! -f /tmp/detpacked/targets.rft ]; then
    t0=$(date +%s)
    photos=()
    [ ! -f /tmp/photos/manifest.tsv ] || photos=(--photos /tmp/photos)
    timeout 150 python3 benches/make_coco.py /tmp/coco --count "${COUNT:-2000}" "${photos[@]}" || echo "make_coco rc $?"
    "$RINGFEED_BIN" pack /tmp/coco/images /tmp/detpacked --coco /tmp/coco/annotations.json --masks /tmp/coco/masks \
      --threads 16 --progress none --force | tail -2
    echo "data: $(( $(date +%s) - t0 )) s"
  fi
  det() {  # name, models, timeout
    timeout "$3" python3 benches/det_train.py --data /tmp/coco --packed /tmp/detpacked --models "$2" \
      --threads "${DET_THREADS:-6,15}" --steps 20 --seconds 12 --warmup-s 12 --out "$out/det/$1" ${DET_ARGS:-} 2>&1 \
      | tee "$out/det/$1.log" | grep -v "^{" | tail -16 || echo "$1 rc $?"
  }
  det "${DET_MODELS:-retinanet}" "${DET_MODELS:-retinanet}" 230
  [ "${DET_SEG:-1}" = 0 ] || det deeplab deeplab 200
  ;;
gt)
  # `gt NAME "ARGS" [NAME "ARGS" ...]`: gpu_train.py runs on setup's corpus (DALI unpacked where
  # carried), each with --warmup-s 12 and its own ARGS, into $out/NAME; prints each table.
  dali_unpack
  shift
  while [ $# -ge 2 ]; do
    mkdir -p "$out/$1"
    # shellcheck disable=SC2086 # ARGS are words
    timeout 280 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --warmup-s 12 \
      --out "$out/$1" $2 2>&1 | grep -v '^{' | tail -12 || echo "$1 rc $?"
    shift 2
  done
  ;;
train)
  mkdir -p "$out"
  timeout 200 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18 \
    --loaders ceiling,ringfeed,ringfeed-hybrid,dali --workers 15 --threads-cap 6 --steps 500 --out "$out/r18-6" 2>&1 | tail -24 || echo "r18-6 rc $?"
  timeout 200 python3 benches/e2e/gpu_train.py --images /tmp/photos --packed /tmp/packed --models resnet18,resnet50 \
    --loaders ceiling,ringfeed,ringfeed-hybrid,dali --workers 15 --steps 200 --out "$out/r-15" 2>&1 | tail -30 || echo "r-15 rc $?"
  ;;
esac
