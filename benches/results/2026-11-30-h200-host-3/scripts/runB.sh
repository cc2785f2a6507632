. .carry/common.sh
timeout 330 python3 benches/e2e/gpu_train.py --images bench-data/corpus --packed bench-data/packed --models resnet50,resnet18 --workers 15 --steps 150 --out $OUT/gpu
timeout 240 python3 benches/autotune.py bench-data/packed --out $OUT/autotune-gpu --batch-size 256 --fixed 6,8,10,15 --seconds 12 --auto-seconds 40 --threads 16 --model resnet50 --skip-sim
