# The one-step torch profile of attention-outputs.txt: stop 23's script
# (experiments/raw/2026-12-02-stream-head/scripts/prof.py) with its host dtype spelled as the
# current spec takes it (float32/bfloat16). usage: bash profile-step.sh 512 fp32
mkdir -p /tmp/prof && sed 's/host_dtype=dt/host_dtype={"fp32":"float32","bf16":"bfloat16"}[dt]/' \
  "$(dirname "$0")/../2026-12-02-stream-head/scripts/prof.py" > /tmp/prof/prof.py
cd /tmp/prof && python prof.py "$@"
