# Xeon with AMX (KVM family 6 model 167), 2 cores; run from the repo root with the venv active.
# Code: the commit named in the record. Sequential; nothing else running.
set -x
R=experiments/raw/2026-12-02-xeon-amx
python -m npu_lora.bench.kernels --tokens 128 512 --dtypes bfloat16 --impls copy grouped_mm npu_lora_stream npu_lora_stream@avx512bf16 --threads 2 --rounds 6 --out $R/kernels-bf16-isa
python -m npu_lora.bench.kernels --tokens 128 512 --dtypes float32 bfloat16 --impls copy grouped_mm npu_lora_stream --threads 2 --rounds 6 --out $R/kernels-dtypes
python -m npu_lora.bench.kernels --dtype-ab npu_lora_stream --tokens 128 512 --threads 2 --rounds 6 --out $R/dtype-ab
PYTHONPATH=/tmp/kt python experiments/kt-peer/kt_side_by_side.py --tokens 128 512 --rounds 6 --out $R/kt-side-by-side
