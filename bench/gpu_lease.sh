#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md ("On a GPU") in one short lease of a GPU machine.
#
# Run from the repository root on a machine with one CUDA GPU and a CUDA build of torch.
# textgym's dependencies that the machine lacks are installed from wheels in .whl/ (if that
# folder exists: the device machine has no package index), into /tmp/site, without touching
# the machine's torch. Each step has its own time limit and writes its own file under $OUT, so
# a step that fails or runs long costs only itself:
#   env.txt        GPU, driver, CUDA, torch and transformers versions
#   gpu.txt        bench/gpu.py on 0.5b-v152k: update tokens/s and MFU (bf16), peak memory
#                  of GRPO vs PPO vs LoRA GRPO
#   update.txt     bench/update_step.py --device cuda --precision bf16 on 0.5b-v152k, textgym
#                  against TRL on the same GPU (GRPO, SFT, DPO rows; ratios on the last lines)
#   tests.txt      the trainers' tests with TEXTGYM_TEST_DEVICE=cuda (policies built on the GPU)
#
#     OUT=/tmp/gpu bash bench/gpu_lease.sh
set -u
OUT=${OUT:-/tmp/gpu_lease}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl > "$OUT/install.txt" 2>&1 || { cat "$OUT/install.txt"; exit 1; }
    export PYTHONPATH=$PWD:/tmp/site
else
    export PYTHONPATH=$PWD
fi
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
    python3 -c "import trl, peft; print('trl', trl.__version__, 'peft', peft.__version__)"
    lscpu | grep -E "Model name|^CPU\(s\)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
step() {  # step NAME SECONDS COMMAND...: run with a limit, keep the output, print its tail
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    echo "== $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/$name.txt"
    tail -n 25 "$OUT/$name.txt"
}
step gpu "${GPU_S:-150}" python3 bench/gpu.py --preset 0.5b-v152k --device cuda
step update "${UPDATE_S:-170}" python3 bench/update_step.py --device cuda --precision bf16 \
    --preset 0.5b-v152k --steps 3 --threads 8
step tests "${TESTS_S:-150}" env TEXTGYM_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
    -n 8 -m "not slow" -rfE tests/trainers/test_sft.py tests/trainers/test_grpo.py \
    tests/trainers/test_ppo.py tests/trainers/test_preference.py tests/trainers/test_reward_model.py \
    tests/trainers/test_lora.py tests/trainers/test_precision.py tests/trainers/test_exact_rl.py \
    tests/trainers/test_logprobs.py
