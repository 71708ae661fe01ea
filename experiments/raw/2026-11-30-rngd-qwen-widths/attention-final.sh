cd /work/main
export PYTHONPATH=/work/main/worker TMPDIR=/tmp/rngd-qwen/tmp-afwd
mkdir -p $TMPDIR
$HOME/.cache/npu-lora/rngd-venv/bin/python -m npu_lora.rngd.check --widths qwen3-30b-a3b \
  --seq-len 128 --dtype float32 --graphs attention --tier compile --cache-dir /tmp/rngd-qwen/cache-attn-final \
  --timeout 3000 --json /tmp/rngd-qwen/attn-final.json
echo "rc=$?"
