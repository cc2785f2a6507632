. .carry/common.sh
lscpu > $OUT/lscpu.txt
python3 benches/e2e/h2d.py bench-data/packed --json $OUT/h2d.json
timeout 480 python3 benches/e2e/cpu_scaling.py --images bench-data/corpus --packed bench-data/packed --threads 1,4,8,15 --batches 24 --out $OUT/cpu
