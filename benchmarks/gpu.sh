#!/usr/bin/env bash
# One GPU, one command: the d20 optimizer step (ours, batched and per matrix, and the Gram variant, against
# torch.optim.Muon) and d20 training throughput (MidTrainer against a plain PyTorch loop, bf16 autocast).
#     bash benchmarks/gpu.sh              # BATCH=16 bash benchmarks/gpu.sh if 32 x 2048 does not fit
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "benchmarks/gpu.sh: no CUDA device visible to torch; run benchmarks/optim_step.py and" \
         "benchmarks/throughput.py directly for the CPU figures" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
echo "== optimizer step, d20 matrices"
python benchmarks/optim_step.py --depth 20 --repeats 5
echo "== training throughput, d20 (width 1280, vocab 65536, ${BATCH:-32} x 2048 tokens per step)"
python benchmarks/throughput.py --depth 20 --n_embd 1280 --vocab 65536 --seq 2048 --batch "${BATCH:-32}" \
    --grad_accum 1 --steps 20 --warmup 5 --dtype bfloat16
