# usage: ab.sh T dtype rounds bin...   (alternating order each round)
T=$1; dt=$2; n=$3; shift 3; bins="$@"
for k in $(seq 1 $n); do
  if [ $((k % 2)) = 1 ]; then order="$bins"; else order=$(echo $bins | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for b in $order; do echo -n "$k $b "; /tmp/$b --T $T --dtype $dt --threads 2 --isa ${ISA:-1} --reps ${REPS:-5} --woff 64 | tr '\n' ' ' | sed 's/mean phase ms://'; echo; done
done
