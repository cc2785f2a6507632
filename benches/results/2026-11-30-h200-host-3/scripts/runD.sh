. .carry/common.sh
timeout 300 python3 benches/e2e/gpu_train.py --images bench-data/corpus --packed bench-data/packed --models resnet50,resnet18 --workers 15 --steps 150 --out $OUT/gpu
# Per-core rate of a contention-free decode alone, and beside 14 busy cores doing the same.
mkdir -p $OUT/percore
$CORPUS_RATE_BIN bench-data/corpus decode 1 1 > $OUT/percore/alone.json
($CORPUS_RATE_BIN bench-data/corpus decode 14 20 > $OUT/percore/neighbours.json) & sleep 4
$CORPUS_RATE_BIN bench-data/corpus decode 1 1 > $OUT/percore/beside-14.json
wait
cat $OUT/percore/*.json
