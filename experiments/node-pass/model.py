"""Roofline model of the host MoE of one step, with and without the node's shared expert pass,
checked against ``node_pass_bench.py``'s measurements and projected to an 8-card node.

Per layer and direction, one kernel pass over ``n`` tokens takes
``t(n) = max(B(n) / BW, F(n) / P)`` with ``B(n)`` the hit experts' weight bytes (uniform routing:
``E · (1 - (1 - K/E)^n)`` experts hit, ``b_e`` bytes each), ``F(n) = 2 · n · K · 3 · H · I``
FLOPs (forward; the backward's two weight passes, dx and z, are the same count), ``BW`` the
node's read bandwidth and ``P`` the node's compute rate (the kernel's own rate at a large pass).

- shared pass, R ranks of T tokens: one pass over R·T tokens with the node's whole BW and P:
  ``t_shared = t(R·T)``;
- separate: R passes at once, sharing BW and P: ``t_sep = max(R · B(T) / BW, R · F(T) / P)``;
- step host MoE = 2 directions × L layers × t.

    python experiments/node-pass/model.py rounds.jsonl [P_GFLOPS]
"""

from __future__ import annotations

import json
import statistics
import sys

E, H, I, K = 128, 2048, 768, 8  # noqa: E741
B_E = 3 * H * I * 2  # bytes of one expert in bf16


def hit_bytes(n: float) -> float:
    return E * (1 - (1 - K / E) ** n) * B_E


def flops(n: float) -> float:
    return 2 * n * K * 3 * H * I


def t_pass(n: float, bw: float, p: float) -> float:
    return max(hit_bytes(n) / bw, flops(n) / p)


def t_sep(R: int, T: float, bw: float, p: float) -> float:
    return max(R * hit_bytes(T) / bw, R * flops(T) / p)


def step(R: int, T: float, bw: float, p: float, L: int, shared: bool) -> float:
    t = t_pass(R * T, bw, p) if shared else t_sep(R, T, bw, p)
    return 2 * L * t


def main(path: str, p_override: float | None = None) -> None:
    with open(path) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    lim = next(r for r in rows if "limits" in r)
    S = lim["S"]
    bw = lim["limits"]["read_gbs"] * 1e9
    p = lim["limits"]["kernel_gflops"] * 1e9
    if p_override:  # GFLOP/s, e.g. the rate the shared pass itself reached
        p = p_override * 1e9
    print(f"inputs: read BW {bw / 1e9:.1f} GB/s, kernel compute rate {p / 1e9:.0f} GFLOP/s")
    print("check against this machine (2 layers, S per rank), host MoE s/step:")
    meas = {}
    for v in ("shared", "separate", "one"):
        steps: dict = {}
        for r in rows:
            if r.get("variant") == v and r["round"] > 0:
                steps.setdefault((r["round"], r["step"]), []).append(r["total_s"])
        meas[v] = statistics.median(max(g) for g in steps.values())
    pred = {
        "shared": step(2, S, bw, p, 2, True),
        "separate": step(2, S, bw, p, 2, False),
        "one": step(1, S, bw, p, 2, True),
    }
    for v in pred:
        print(f"  {v:9s} model {pred[v]:.3f} s  measured {meas[v]:.3f} s")
    print(
        f"  ratio shared/separate: model {pred['shared'] / pred['separate']:.2f}, "
        f"measured {meas['shared'] / meas['separate']:.2f}"
    )
    print("8-card node, 48 layers (Qwen3-30B-A3B), host MoE s/step, with / without shared pass:")
    for label, nbw, np_ in (
        ("this host's BW and P", bw, p),
        ("BW x16, P x16", 16 * bw, 16 * p),
    ):
        for T in (128, 512):
            a, b = step(8, T, nbw, np_, 48, True), step(8, T, nbw, np_, 48, False)
            print(
                f"  {label:22s} T={T:4d}: shared {a:8.2f} s  separate {b:8.2f} s  ratio {a / b:.2f}"
            )


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else None)
