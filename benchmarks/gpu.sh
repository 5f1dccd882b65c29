#!/usr/bin/env bash
# One GPU, one command, bounded in time: the optimizer step of both recipes and both orthogonalisation dtypes against
# torch.optim.Muon (d12, d20), the optimizer's memory (W = 1), then d20 training throughput, MFU, compile time and
# peak memory of MidTrainer against nanochat's loop, 1 process, bf16 autocast.
#     bash benchmarks/gpu.sh              # BATCH=16 bash benchmarks/gpu.sh if 32 x 2048 does not fit
#                                         # PEAK_TFLOPS=... for a GPU the MFU table does not know (H100/H200/A100 do)
#                                         # COMPILE=both adds the compiled arms (a minute or more of compilation each)
#     SMOKE=1 bash benchmarks/gpu.sh      # first, about a minute: import, one d4 step of each loop, a 4-step
#                                         # mid_train on CUDA and its model's logits and greedy tokens against CPU's
#     WHEELS=dir bash benchmarks/gpu.sh   # a machine without network whose packages are older than ours: the wheels
#                                         # in dir are installed first, ahead of its own (docs/performance.md)
# Every step has its own time limit (STEP_S seconds, default 150; the throughput step twice that) and a step that
# runs over is stopped with everything it started, so the whole script ends within about 10 minutes and each table
# is printed as soon as its step ends (a lent GPU's lease is short: tee the output to a file as you run it).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
site= out=
trap 'rm -rf "$site" "$out"' EXIT
if [ -n "${WHEELS:-}" ]; then
    site=$(mktemp -d)
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$WHEELS"/*.whl || exit 1
    export PYTHONPATH="$site:$PYTHONPATH"
fi
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "benchmarks/gpu.sh: no CUDA device visible to torch; run benchmarks/optim_step.py and" \
         "benchmarks/throughput.py directly for the CPU figures" >&2
    exit 1
fi
STEP_S=${STEP_S:-150}
failed=0
step() {  # step SECONDS TITLE COMMAND...: run one benchmark under its own limit, say how long it took
    local limit=$1 title=$2 start=$SECONDS rc
    shift 2
    echo "== $title (limit ${limit} s)"
    timeout -k 10 "$limit" "$@"
    rc=$?
    [ $rc -eq 124 ] && echo "== $title: stopped at its ${limit} s limit"
    [ $rc -ne 0 ] && failed=1
    echo "== $title: exit $rc after $((SECONDS - start)) s"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'transformers', transformers.__version__)"
date -u
if [ -n "${SMOKE:-}" ]; then
    step 90 "smoke: one d4 step of each loop" "$PY" benchmarks/throughput.py --depth 4 --steps 3 --warmup 1 \
        --processes 1 --compile eager --repeats 1
    out=$(mktemp -d)
    step 90 "smoke: mid_train, demo data, 4 steps on CUDA" "$PY" scripts/mid_train.py --model_source demo \
        --demo_depth 2 --max_seq_len 64 --device_batch_size 2 --total_batch_size 256 --eval_every 4 \
        --eval_tokens 512 --spelling_eval_rows 4 --chat_eval_tasks "" --torch_compile false --num_iterations 4 \
        --report_to none --disable_tqdm true --output_dir "$out"
    step 60 "smoke: the written model on CPU and CUDA (float32)" "$PY" - "$out" <<'PY'
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)
ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
out = {}
for device in ("cpu", "cuda"):
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True, dtype=torch.float32)
    model = model.to(device).eval()
    with torch.no_grad():
        logits = model(ids.to(device)).logits.cpu()
        out[device] = logits, model.generate(ids.to(device), max_new_tokens=16, do_sample=False).cpu()
diff = (out["cpu"][0] - out["cuda"][0]).abs().max().item()
same = torch.equal(out["cpu"][1], out["cuda"][1])
print(f"logits CPU vs CUDA: max abs difference {diff:.2e}; greedy tokens equal: {same}")
PY
    exit $failed
fi
step "$STEP_S" "optimizer step, both recipes x both dtypes vs torch.optim.Muon" \
    "$PY" benchmarks/optim_step.py --depth 12 20 --repeats 5
step "$STEP_S" "optimizer memory per rank (W = 1), d12 and d20" "$PY" benchmarks/optim_memory.py --cuda
# --run_steps: the compile verdict for a run of that many of these steps (an epoch of nanochat's mid-training mixture
# on one GPU is thousands of them)
step $((2 * STEP_S)) "training, d20 (width 1280, vocab 65536, ${BATCH:-32} x 2048 tokens per step)" \
    "$PY" benchmarks/throughput.py --depth 20 --vocab 65536 --seq 2048 --batch "${BATCH:-32}" --grad_accum 1 \
    --steps 20 --warmup 5 --processes 1 --compile "${COMPILE:-eager}" --run_steps 2000 \
    ${PEAK_TFLOPS:+--peak_tflops "$PEAK_TFLOPS"}
date -u
exit $failed
