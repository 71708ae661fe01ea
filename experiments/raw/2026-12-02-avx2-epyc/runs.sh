# what was run, in this order (one process at a time, nothing else running)
R=experiments/raw/2026-12-02-avx2-epyc
python -m npu_lora.bench.kernels --dtype-ab npu_lora_stream --tokens 128 512 --threads 2 --rounds 6 --out $R/dtype-ab-2threads  # -> dtype-ab.log
TAG=a bash $R/engine-fp32.sh > $R/engine-a-fp32.log 2>&1
TAG=a bash $R/engine-bf16.sh > $R/engine-a-bf16.log 2>&1
for t in b c; do
  TAG=$t bash $R/engine-bf16.sh > $R/engine-$t-bf16.log 2>&1
  TAG=$t bash $R/engine-fp32.sh > $R/engine-$t-fp32.log 2>&1
done
# core benchmark, axpy column chunks (dropped): bench.cpp built with -DNPU_LORA_AXPY_CC=256/512/1024 (a
# prototype that ran the backward axpy over column chunks of that width, outermost), alternated:
#   ab.sh 128 bf16 4 sb0 sb_cc256 sb_cc512 sb_cc1024 > axpy-cc-bf16-t128.txt   (scripts/ab.sh)
python -m npu_lora.bench.kernels --dtype-ab npu_lora_stream --tokens 128 512 --threads 1 --rounds 4 --out $R/dtype-ab-1thread   # -> dtype-ab-1thread.log
python -m npu_lora.bench.kernels --tokens 128 512 --dtypes float32 --impls copy grouped_mm npu_lora_stream --threads 2 --rounds 4 --out $R/fp32-vs-grouped-2threads  # -> fp32-vs-grouped.log
TAG=a bash $R/engine-dtype-ab.sh > $R/engine-dtype-ab-a.log 2>&1
# at fceedcf (bf16 axpy in unpack order):
#   ab.sh 128 bf16 4 sb0 sb_u16 (REPS=7) > u16-bf16-t128.txt; ab.sh 512 bf16 2 sb0 sb_u16 (REPS=3) > u16-bf16-t512.txt
python -m npu_lora.bench.kernels --dtype-ab npu_lora_stream --tokens 128 512 --threads 2 --rounds 6 --out $R/dtype-ab-2threads-u16  # -> dtype-ab-u16.log
TAG=u16 bash $R/engine-dtype-ab.sh > $R/engine-dtype-ab-u16.log 2>&1
# prefetch variants (bench.cpp builds from edited copies of the kernels): ab.sh 128 bf16 4 sb_u16 sb_pft0 sb_pfd1 sb_pfd3 (REPS=5)
