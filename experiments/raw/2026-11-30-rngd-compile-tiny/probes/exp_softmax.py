"""Which softmax-backward formulations compile as a whole graph (fp32/bf16, [1,4,128,128])?"""
import os, sys, time, json
os.environ["XDG_CACHE_HOME"] = "/tmp/rngd/cache-softmax"; os.environ["TMPDIR"] = "/tmp/rngd/scratch/tmp"
import torch, furiosa.torch as ft

def stock(y, g):           # the math of _softmax_backward_data
    return y * (g - (g * y).sum(-1, keepdim=True))
def mm_reduce(y, g):       # the row sum as a matmul with a ones column
    ones = torch.ones(y.shape[-1], 1, dtype=y.dtype)
    return y * (g - torch.matmul(g * y, ones))
def two_step(y, g):        # y*g - y*s  (no fused sub before the mul)
    s = (g * y).sum(-1, keepdim=True)
    return y * g - y * s
def sbd(y, g):             # the aten op itself
    return torch.ops.aten._softmax_backward_data(g, y, -1, y.dtype)

variants = sys.argv[1].split(",")
dtypes = sys.argv[2].split(",")
res = []
for name in variants:
    fn = globals()[name]
    for dt in dtypes:
        dtype = getattr(torch, dt)
        y = torch.softmax(torch.randn(1, 4, 128, 128), -1).to(dtype)
        g = torch.randn(1, 4, 128, 128).to(dtype)
        t = time.time()
        try:
            ft.CompileModule.from_module(fn, (y, g)); ok, err = True, ""
        except Exception as e:
            ok, err = False, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        r = {"variant": name, "dtype": dt, "ok": ok, "seconds": round(time.time() - t, 1), "err": err}
        print(json.dumps(r), flush=True)
