import os, time
os.environ["XDG_CACHE_HOME"]="/tmp/rngd/cache"; os.environ["TMPDIR"]="/tmp/rngd/scratch/tmp"
import torch, furiosa.torch
from furiosa.torch.dryrun import dryrun
def f1(a, b): return a + b
for shape in [(2,5), (8,8), (1,128), (2,8), (64,)]:
    a = torch.randint(0, 30, shape)
    r = dryrun(f1, a, a.clone(), verbose=False)
    print(shape, [(rep.target, rep.report.status.name) for rep in r.reports], flush=True)
    r = dryrun(f1, a.to(torch.int32), a.to(torch.int32), verbose=False)
    print(shape, "int32", [(rep.target, rep.report.status.name) for rep in r.reports], flush=True)
