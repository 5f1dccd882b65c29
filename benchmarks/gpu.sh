#!/usr/bin/env bash
# One GPU, one command: the d20 optimizer step against torch.optim.Muon, then d20 training throughput, MFU, compile
# time and peak memory of MidTrainer against nanochat's loop, eager and compiled, 1 process, bf16 autocast.
#     bash benchmarks/gpu.sh              # BATCH=16 bash benchmarks/gpu.sh if 32 x 2048 does not fit
#                                         # PEAK_TFLOPS=... for a GPU the MFU table does not know (H100/H200/A100 do)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "benchmarks/gpu.sh: no CUDA device visible to torch; run benchmarks/optim_step.py and" \
         "benchmarks/throughput.py directly for the CPU figures" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
date -u
echo "== optimizer step, d20 matrices"
python benchmarks/optim_step.py --depth 20 --repeats 5 --details
echo "== training, d20 (width 1280, vocab 65536, ${BATCH:-32} x 2048 tokens per step), eager and compiled"
# --run_steps: the compile verdict for a run of that many of these steps (an epoch of nanochat's mid-training mixture
# on one GPU is thousands of them)
python benchmarks/throughput.py --depth 20 --vocab 65536 --seq 2048 --batch "${BATCH:-32}" --grad_accum 1 \
    --steps 30 --warmup 10 --processes 1 --compile both --run_steps 2000 ${PEAK_TFLOPS:+--peak_tflops "$PEAK_TFLOPS"}
