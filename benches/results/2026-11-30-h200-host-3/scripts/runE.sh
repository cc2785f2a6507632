. .carry/common.sh
timeout 150 python3 benches/e2e/gpu_train.py --images bench-data/corpus --packed bench-data/packed --models resnet18 --workers 15 --steps 150 --out $OUT/gpu-resnet18-again
timeout 300 python3 benches/e2e/cpu_scaling.py --images bench-data/corpus --packed bench-data/packed --threads 1,15 --batches 24 --pin --out $OUT/cpu-again
