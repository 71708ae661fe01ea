# core alone (no torch): thread scaling and ISA paths, bf16 and fp32, medians of 7 after a warm-up
K=worker/npu_lora/moe/kernels
g++ -O3 -fno-math-errno -fopenmp -std=c++17 -I$K experiments/stream-kernel/bench.cpp $K/stream_{amx,avx2,avx512,avx512bf16,base}.cpp -o /tmp/stream-bench
for rep in 1 2; do
for T in 128 512; do
  for th in 1 2; do
    /tmp/stream-bench --T $T --dtype bf16 --threads $th --isa 4 --reps 7
    /tmp/stream-bench --T $T --dtype bf16 --threads $th --isa 3 --reps 7
    /tmp/stream-bench --T $T --dtype fp32 --threads $th --isa 2 --reps 7
  done
done
done
