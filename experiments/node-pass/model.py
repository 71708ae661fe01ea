"""Model of the host MoE of one step, with and without the node's shared expert pass, checked
against ``node_pass_bench.py``'s measurements (one or more runs, e.g. a sweep over S) and
projected to an 8-card node.

Per layer and direction, one kernel pass over ``n`` tokens reads ``B(n)`` bytes (the hit
experts' weights; uniform routing: ``E · (1 - (1 - K/E)^n)`` experts hit, ``b_e`` bytes each)
and does ``F(n) = 2 · n · K · 3 · H · I`` FLOPs (forward; the backward's two weight passes, dx
and z, are the same count). Two ways to combine them:

- **measured form (additive)**: ``t(n) = B(n) / BW_s + F(n) / P_s``. This kernel on the 2-core
  hosts measured so far does not hide its weight stream behind its arithmetic: a pass over twice
  the tokens costs the stream again plus the extra FLOPs (2026-12-04-shared-pass-regime:
  T=128 → 256 costs 1.33×, where ``max`` would say 2× or 1×). ``BW_s`` and ``P_s`` are fitted
  (least squares, no intercept) to the **1-rank** variant's host MoE time over every run given,
  so the shared and separate variants are predictions, not fits.
- **roofline bound**: ``t(n) = max(B(n) / BW, F(n) / P)`` with ``BW`` the measured read
  bandwidth and ``P`` the kernel's rate at a large pass: what a kernel that fully overlaps its
  stream with its arithmetic could reach (the previous version of this model; it predicted 1.00
  at S=128 where 0.71 was measured).

Variants, R ranks of T tokens each:

- shared pass: one pass over R·T tokens with the node's whole BW and P: ``t_shared = t(R·T)``;
- separate: R passes at once, sharing BW and P: ``R · B(T) / BW_s + R · F(T) / P_s`` (additive),
  ``max(R · B(T) / BW, R · F(T) / P)`` (bound);
- step host MoE = 2 directions × L layers × t.

So in the additive form ``shared / separate = (B(R·T)/BW_s + C) / (R · B(T)/BW_s + C)`` with
``C = R · F(T) / P_s`` the same in both: the shared pass saves the repeated stream and nothing
else, and reaches ``1/R`` only where the arithmetic is negligible against the stream.

    python experiments/node-pass/model.py p1-s32.jsonl p1-s64.jsonl p1-s128.jsonl ... [P_GFLOPS]

With runs at one S only the additive form cannot be fitted and only the bound is printed (the
2026-12-03 record's use); a number among the arguments replaces the bound's compute rate ``P``
(e.g. the rate the shared pass itself reached).
"""

from __future__ import annotations

import json
import statistics
import sys

E, H, I, K = 128, 2048, 768, 8  # noqa: E741
B_E = 3 * H * I * 2  # bytes of one expert in bf16
LAYERS_BENCH = 2


def hit_bytes(n: float) -> float:
    return E * (1 - (1 - K / E) ** n) * B_E


def flops(n: float) -> float:
    return 2 * n * K * 3 * H * I


def t_add(n: float, bw: float, p: float) -> float:
    return hit_bytes(n) / bw + flops(n) / p


def t_bound(n: float, bw: float, p: float) -> float:
    return max(hit_bytes(n) / bw, flops(n) / p)


def step(R: int, T: float, bw: float, p: float, L: int, shared: bool, additive: bool) -> float:
    """Host MoE seconds of one step (2 directions x L layers)."""
    if shared:
        n = R * T
        t = t_add(n, bw, p) if additive else t_bound(n, bw, p)
    elif additive:
        t = R * t_add(T, bw, p)
    else:
        t = max(R * hit_bytes(T) / bw, R * flops(T) / p)
    return 2 * L * t


def load(path: str) -> dict:
    """One bench run: S, read BW, kernel rate, and each variant's median host MoE s/step."""
    with open(path) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    lim = next(r for r in rows if "limits" in r)
    meas = {}
    for v in ("shared", "separate", "one"):
        steps: dict = {}
        for r in rows:
            if r.get("variant") == v and r["round"] > 0:
                steps.setdefault((r["round"], r["step"]), []).append(r["total_s"])
        meas[v] = statistics.median(max(g) for g in steps.values())
    return {
        "path": path,
        "S": lim["S"],
        "bw": lim["limits"]["read_gbs"] * 1e9,
        "p": lim["limits"]["kernel_gflops"] * 1e9,
        "meas": meas,
    }


def fit(runs: list[dict]) -> tuple[float, float] | None:
    """(BW_s, P_s) of the additive form from the 1-rank variant: least squares of
    one(S) = 2 L (B(S) · u + F(S) · v) over the runs, u = 1/BW_s, v = 1/P_s; None with fewer
    than two S."""
    xs = [(2 * LAYERS_BENCH * hit_bytes(r["S"]), 2 * LAYERS_BENCH * flops(r["S"])) for r in runs]
    ys = [r["meas"]["one"] for r in runs]
    sbb = sum(b * b for b, _ in xs)
    sff = sum(f * f for _, f in xs)
    sbf = sum(b * f for b, f in xs)
    sby = sum(b * y for (b, _), y in zip(xs, ys, strict=True))
    sfy = sum(f * y for (_, f), y in zip(xs, ys, strict=True))
    det = sbb * sff - sbf * sbf
    if len({r["S"] for r in runs}) < 2 or det <= 0:
        return None
    u = (sby * sff - sfy * sbf) / det
    v = (sfy * sbb - sby * sbf) / det
    return 1 / u, 1 / v


def main(paths: list[str], p_override: float | None = None) -> None:
    runs = sorted((load(p) for p in paths), key=lambda r: r["S"])
    if p_override:
        for r in runs:
            r["p"] = p_override * 1e9
    fitted = fit(runs)
    bw = statistics.median(r["bw"] for r in runs)
    p = statistics.median(r["p"] for r in runs)
    if fitted:
        bw_s, p_s = fitted
        print(
            f"additive form, fitted to the 1-rank variant over {len(runs)} runs: "
            f"BW_s {bw_s / 1e9:.1f} GB/s, P_s {p_s / 1e9:.0f} GFLOP/s"
        )
    else:
        print("additive form: not fitted (needs runs at two or more S); bound only")
    print(
        f"roofline bound, measured (medians): read BW {bw / 1e9:.1f} GB/s, P {p / 1e9:.0f} GFLOP/s"
    )
    print("check against this machine (2 ranks, 2 layers), host MoE s/step:")
    print("| S | variant | measured | additive | bound |")
    print("| --- | --- | --- | --- | --- |")

    def add(R: int, S: float, L: int, shared: bool) -> float | None:
        return step(R, S, *fitted, L, shared, True) if fitted else None

    def fmt(x: float | None, spec: str) -> str:
        return "—" if x is None else format(x, spec)

    for r in runs:
        S, m = r["S"], r["meas"]
        a, b = {}, {}
        for v, R, shared in (("shared", 2, True), ("separate", 2, False), ("one", 1, True)):
            a[v] = add(R, S, LAYERS_BENCH, shared)
            b[v] = step(R, S, r["bw"], r["p"], LAYERS_BENCH, shared, False)
            print(f"| {S} | {v} | {m[v]:.3f} | {fmt(a[v], '.3f')} | {b[v]:.3f} |")
        ra = a["shared"] / a["separate"] if a["shared"] is not None and a["separate"] else None
        print(
            f"| {S} | **shared / separate** | **{m['shared'] / m['separate']:.2f}** "
            f"| {fmt(ra, '.2f')} | {b['shared'] / b['separate']:.2f} |"
        )
    print("8-card node, 48 layers (Qwen3-30B-A3B), host MoE s/step, shared / separate (ratio):")
    cases = [("this host, bound", bw, p, False)]
    if fitted:
        bw_s, p_s = fitted
        cases = [
            ("this host, additive", bw_s, p_s, True),
            *cases,
            ("BW x16, P x16, additive", 16 * bw_s, 16 * p_s, True),
            ("BW x4, P x16, additive", 4 * bw_s, 16 * p_s, True),
        ]
    for label, nbw, np_, additive in cases:
        for T in (128, 512):
            a = step(8, T, nbw, np_, 48, True, additive)
            b = step(8, T, nbw, np_, 48, False, additive)
            print(f"  {label:24s} T={T:4d}: {a:8.2f} s / {b:8.2f} s ({a / b:.2f})")


if __name__ == "__main__":
    args = sys.argv[1:]
    nums = [a for a in args if a.replace(".", "", 1).isdigit()]
    files = [a for a in args if a not in nums]
    if not files:
        raise SystemExit(__doc__)
    main(files, float(nums[0]) if nums else None)
