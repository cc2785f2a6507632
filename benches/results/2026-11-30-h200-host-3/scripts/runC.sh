. .carry/common.sh
timeout 200 python3 benches/autotune.py bench-data/packed --out $OUT/autotune --step-ms 40 --batch-size 128 --fixed 4,6,8,15 --seconds 12 --auto-seconds 30 --threads 16
cd client-py && RINGFEED_BIN=$RINGFEED_BIN timeout 200 python3 -m pytest -q tests/test_cuda.py tests/test_serve.py tests/test_server_killed.py 2>&1 | tee $OUT/pytest-cuda.log | tail -5
