# standalone core (experiments/stream-kernel/bench.cpp built as in its header, with stream_avx512bf16.cpp):
# native (isa 3) vs widening (isa 2) bf16, and fp32 (isa 2), alternated, 2 alternations, medians of 5 reps each
B=/tmp/z/stream-bench
for T in 128 512; do for rep in 1 2; do
  for isa in 2 3; do $B --T $T --dtype bf16 --threads 2 --isa $isa --reps 5 | head -1; done
  $B --T $T --dtype fp32 --threads 2 --isa 2 --reps 5 | head -1
done; done
