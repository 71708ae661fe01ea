# Core A/B (no torch): experiments/stream-kernel/bench.cpp built from two revisions of the kernel
# sources, run alternately. OLD (default 97e4cd9: AVX2 axpy 3 x 4, coefficients in registers)
# against NEW (default: the working tree: 4 x 5, coefficients as FMA memory operands).
# usage: bash core-ab.sh [rounds]   (run from the repository root; prints one line per run)
set -e
OLD=${OLD:-97e4cd9}; R=${1:-3}; W=$(mktemp -d)
mkdir -p $W/old $W/new
git archive $OLD worker/npu_lora/moe/kernels experiments/stream-kernel/bench.cpp | tar -x -C $W/old
mkdir -p $W/new/worker/npu_lora/moe $W/new/experiments/stream-kernel
cp -r worker/npu_lora/moe/kernels $W/new/worker/npu_lora/moe/
cp experiments/stream-kernel/bench.cpp $W/new/experiments/stream-kernel/
for v in old new; do
  (cd $W/$v/experiments/stream-kernel && g++ -O3 -fno-math-errno -fopenmp -std=c++17 -I../../worker/npu_lora/moe/kernels \
    bench.cpp ../../worker/npu_lora/moe/kernels/stream_{amx,avx2,avx512,avx512bf16,base}.cpp -o $W/b_$v)
done
for c in "512 fp32" "128 fp32" "128 bf16" "512 bf16"; do
  set -- $c
  for r in $(seq 1 $R); do
    if (( r % 2 )); then o="old new"; else o="new old"; fi
    for v in $o; do echo -n "$v "; $W/b_$v --T $1 --dtype $2 --threads 2 --isa 1 --reps 5 | head -1; done
  done
done
rm -rf $W
