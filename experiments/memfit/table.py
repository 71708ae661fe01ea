"""The record's table: peak RSS of each measured run against the estimate with the committed
constants (npu_lora.api.memory), from the JSON lines of rss_runs.py / q8_run_rss.py.

The runs wrote summary.json ``memory`` with the constants of the moment (a 600 MiB runtime
while measuring); the estimate's other terms are kept and the runtime term recomputed:
ranks × (runtime + tokenizer) + the launcher with more than one rank, and the load transient
(``load_transient_bytes``) added.

    python experiments/memfit/table.py /tmp/memfit/rss1.jsonl ...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

from npu_lora.api import memory as M

MiB = 1 << 20


def main() -> None:
    print(
        "| run | procs | peak RSS (MiB) | cgroup-like (MiB) | RSS less checkpoint (MiB) | "
        "estimate (MiB) | peak / estimate |"
    )
    print("|---|---|---|---|---|---|---|")
    for path in sys.argv[1:]:
        for line in Path(path).read_text().splitlines():
            r = json.loads(line)
            mem = r.get("memory")
            if not mem:
                continue
            t = mem["terms"]
            ranks = mem.get("ranks", 1)
            tok = 0 if "qwen3w" not in r["name"] else M.TOKENIZER_BYTES_PER_TOKEN * 8192
            runtime = ranks * (M.RUNTIME_BYTES + tok) + (M.LAUNCHER_BYTES if ranks > 1 else 0)
            if "qwen3w" in r["name"]:
                L, E, H, inter = 2, 128, 2048, 768
            else:
                c = M.text_config(M.preset_config("tiny-qwen3-moe"))
                L, E, H = c["num_hidden_layers"], c["num_experts"], c["hidden_size"]
                inter = c["moe_intermediate_size"]
            no_trained = SimpleNamespace(lora=SimpleNamespace(train_experts=False))
            transient = M.load_transient_bytes(no_trained, mem["host_dtype"], L, E, H, inter, ranks)
            est = t["weights"] + t["trainable"] + t["activations"] + t["data"] + runtime + transient
            peak = r["tree_peak_rss"] if ranks > 1 else (r["time_max_rss"] or r["tree_peak_rss"])
            less = r.get("peak_rss_less_checkpoint") or 0
            cmp = less if less and "qwen3w" in r["name"] else peak
            print(
                f"| {r['name']} | {r['tree_procs']} | {peak / MiB:.0f} | "
                f"{r.get('tree_peak_charged', 0) / MiB:.0f} | {less / MiB:.0f} | {est / MiB:.0f} | "
                f"{cmp / est:.3f} |"
            )


if __name__ == "__main__":
    main()
