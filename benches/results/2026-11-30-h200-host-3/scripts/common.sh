# Sourced by the device runs: environment, datago from the carried wheel, and the corpus (made
# once per machine).
set -x
export PYTHONUNBUFFERED=1 RINGFEED_BIN=$PWD/.carry/ringfeed CORPUS_RATE_BIN=$PWD/.carry/corpus_rate
export RINGFEED_LOG=warn
nproc; python3 --version; python3 -c 'import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.cuda.get_device_name())'
py=$(python3 -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
if [ ! -d .pydeps/datago ]; then
  python3 -m pip install --no-index --no-deps --target .pydeps .carry/wheels/datago-*-cp$py-*.whl 2>&1 | tail -2 || true
fi
export PYTHONPATH=$PWD/client-py:$PWD/.pydeps
python3 -c 'import datago; print("datago", datago.__file__)' || true
if [ ! -f bench-data/packed/index.rfi ]; then
  mkdir -p bench-data
  time python3 .carry/make_photos.py bench-data/corpus --count 8000 --jobs 16 > /dev/null
  time $RINGFEED_BIN pack bench-data/corpus bench-data/packed --progress none --summary-json $OUT/pack.json
fi
