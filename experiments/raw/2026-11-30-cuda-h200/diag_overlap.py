"""Run-to-run vs overlap on/off gradient differences on cuda (tiny model, hot, keep_graph)."""
import os
import sys
import warnings

import torch

warnings.filterwarnings("ignore")
sys.path.insert(0, "tests/gpu")
import test_cuda_backend as t  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
print("CUBLAS_WORKSPACE_CONFIG", os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
for det in (False, True):
    torch.use_deterministic_algorithms(det)
    runs = t._overlap_on_off() + t._overlap_on_off()  # on, off, on, off
    def diff(a, b):
        return max((runs[a][1][n] - runs[b][1][n]).abs().max().item() for n in runs[a][1])
    print(f"deterministic={det}: on-vs-on {diff(0, 2):.3g}  off-vs-off {diff(1, 3):.3g}  "
          f"on-vs-off {diff(0, 1):.3g}  losses {[r[0] for r in runs]}")
