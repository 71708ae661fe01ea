"""Issue 12 item 3/4 cases, re-run as written through the real CLI (``python -m npu_lora.cli run``).

Usage: python experiments/hardening/run_cases.py [OUT]
Each case builds its input in a scratch directory, runs the CLI in a subprocess and records the
exit code, the first line of the error, the wall time and what the run directory holds after.
The disk-full and read-only cases mount small tmpfs file systems (needs root; skipped otherwise).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BASE = {
    "model": {"preset": "tiny-qwen3-moe"},
    "data": {"path": "example:nsmc-mini"},
    "moe": {"placement": "hot", "warmupSteps": 2},
    "training": {"steps": 6, "seqLen": 64, "batchSize": 2, "learningRate": 5e-3},
    "device": {"backend": "cpu", "cards": 0},
    "checkpoint": {"everySteps": 5},
}


def manifest(name: str = "case", meta: dict | None = None, **over) -> dict:
    spec = yaml.safe_load(yaml.safe_dump(BASE))
    for k, v in over.items():
        if isinstance(v, dict):
            spec.setdefault(k, {}).update(v)
        else:
            spec[k] = v
    return {
        "apiVersion": "npu-lora.io/v1alpha1",
        "kind": "MoEFinetune",
        "metadata": {"name": name, **(meta or {})},
        "spec": spec,
    }


def run(args: list[str], env: dict | None = None, during=None) -> tuple[int, str, float]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("NPU_LORA_")}
    e.update(env or {})
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "npu_lora.cli", "run", *args, "--quiet", "--no-plot"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=e,
        cwd=REPO,
    )
    if during is not None:
        threading.Thread(target=during, daemon=True).start()
    _out, err = p.communicate(timeout=600)
    dt = time.perf_counter() - t0
    lines = [x for x in err.splitlines() if x.startswith("npu-lora run: error:")]
    lines += [x for x in err.splitlines() if "Traceback" in x]
    msg = next((x for x in lines if "Traceback" in x), None) or (lines[0] if lines else "")
    if "Traceback" in err:
        msg = "TRACEBACK: " + msg
    # the first message line plus its continuation (multi-line field lists)
    if lines:
        idx = err.splitlines().index(lines[0])
        nxt = err.splitlines()[idx + 1 : idx + 2]
        if nxt and not nxt[0].startswith(("npu-lora", "WARNING", "resuming")):
            msg += " / " + nxt[0].strip()
    if p.returncode == 0:
        keys = ("resuming", "starting", "belongs", "adopting")
        msg = " / ".join(x for x in err.splitlines() if x.startswith(keys) or "belongs to" in x)
    return p.returncode, msg.replace("npu-lora run: error: ", ""), dt


def listing(d: Path) -> str:
    if not d.exists():
        return "(not created)"
    text = ", ".join(sorted(p.name for p in d.iterdir())) or "(empty)"
    aside = sorted(p.name for p in d.parent.glob(d.name + ".prev-*"))
    return text + (f" (beside it: {', '.join(aside)})" if aside else "")


def main() -> None:
    rows: list[tuple[str, int, str, float, str]] = []
    tmp = Path(tempfile.mkdtemp(prefix="i12cases-"))

    def case(
        title: str,
        doc_or_bytes,
        *,
        out: Path | None = None,
        env=None,
        during=None,
        extra: list[str] | None = None,
    ) -> Path:
        out = out or tmp / f"out-{len(rows)}"
        f = tmp / f"case-{len(rows)}.yaml"
        if isinstance(doc_or_bytes, bytes):
            f.write_bytes(doc_or_bytes)
        elif isinstance(doc_or_bytes, str):
            f.write_text(doc_or_bytes)
        else:
            f.write_text(yaml.safe_dump(doc_or_bytes))
        code, msg, dt = run([str(f), "--out", str(out), *(extra or [])], env, during)
        rows.append((title, code, msg, dt, listing(out)))
        print(rows[-1], flush=True)
        return out

    rnd = random.Random(12)
    case("manifest of random bytes", bytes(rnd.randrange(256) for _ in range(4096)))
    case("YAML nested 100,000 levels deep", "spec: " + "[" * 100_000 + "]" * 100_000 + "\n")
    bomb = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i, c in enumerate("bcdefghij"):
        prev = "abcdefghij"[i]
        bomb.append(f"{c}: &{c} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]")
    doc = yaml.safe_dump(manifest())
    bomb_text = doc.replace(
        "spec:\n",
        "spec:\n  podTemplate:\n    affinity:\n" + "".join(f"      {b}\n" for b in bomb),
        1,
    )
    case("YAML alias bomb inside podTemplate", bomb_text)
    case(
        "lora.alpha: .inf",
        yaml.safe_dump(manifest(lora={"alpha": 1.0})).replace("alpha: 1.0", "alpha: .inf"),
    )
    case(
        "training.maxGradNorm: .inf",
        yaml.safe_dump(manifest(training={"maxGradNorm": 1.0})).replace(
            "maxGradNorm: 1.0", "maxGradNorm: .inf"
        ),
    )
    case(
        "NaN inside podTemplate (tolerations)",
        yaml.safe_dump(
            manifest(podTemplate={"tolerations": [{"key": "k", "tolerationSeconds": 1.5}]})
        ).replace("tolerationSeconds: 1.5", "tolerationSeconds: .nan"),
    )
    case(
        "training.batchSize: 4096, training.seqLen: 32768",
        manifest(training={"batchSize": 4096, "seqLen": 32768}),
    )
    regular = tmp / "a-file"
    regular.write_text("x")
    case("--out under a regular file", manifest(), out=regular / "run")
    ro = tmp / "ro"
    ro.mkdir()
    mounted = (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)]).returncode
        == 0
    )
    if mounted:
        case("--out on a read-only filesystem", manifest(), out=ro / "run")
        subprocess.run(["umount", str(ro)])
    full = tmp / "full"
    full.mkdir()
    if (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(full)]).returncode
        == 0
    ):
        out = full / "run"

        def fill() -> None:  # after the first checkpoint: fill the disk
            while not (out / "checkpoint" / "state.json").exists():
                time.sleep(0.05)
            fh = open(full / "filler", "wb", buffering=0)  # noqa: SIM115
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError:
                pass
            # leave 3 pages: the step records still fit, the next checkpoint does not
            fh.truncate(max(0, fh.tell() - 3 * 4096))
            fh.close()

        case(
            "disk full mid-run (2 MiB tmpfs filled to 12 KiB free after the step-5 checkpoint)",
            manifest(training={"steps": 12}),
            out=out,
            during=fill,
        )
        state = (
            (out / "checkpoint" / "state.json").read_text()
            if (out / "checkpoint").exists()
            else "none"
        )
        rows[-1] = (
            *rows[-1][:4],
            rows[-1][4]
            + "; checkpoint/state.json step: "
            + str(yaml.safe_load(state).get("step") if state != "none" else None),
        )
        subprocess.run(["umount", str(full)])
    root = tmp / "dataroot"
    root.mkdir()
    case(
        "data.path /etc/passwd outside the data root (NPU_LORA_DATA_ROOT set)",
        manifest(data={"path": "/etc/passwd"}),
        env={"NPU_LORA_DATA_ROOT": str(root)},
    )
    case(
        "data.path ../../etc/passwd under data.volume",
        manifest(data={"path": "../../../../../../etc/passwd", "volume": {"claimName": "d"}}),
        env={"NPU_LORA_DATA_ROOT": str(root)},
    )
    case(
        "data.path /etc/passwd, no data root (local run)",
        manifest(data={"path": "/etc/passwd", "format": "nsmc"}),
    )
    case("metadata.name: my.dotted.run", manifest(name="my.dotted.run"))
    shared = tmp / "shared-out"
    case(
        "run a/same-name (uid A) into a directory",
        manifest(name="same-name"),
        out=shared,
        env={"NPU_LORA_RESOURCE_NAMESPACE": "a", "NPU_LORA_RESOURCE_UID": "uid-a"},
    )
    case(
        "same name from namespace b (uid B), same directory",
        manifest(name="same-name"),
        out=shared,
        env={"NPU_LORA_RESOURCE_NAMESPACE": "b", "NPU_LORA_RESOURCE_UID": "uid-b"},
    )
    case(
        "a/same-name deleted and re-created (uid A2): starts fresh",
        manifest(name="same-name"),
        out=shared,
        env={"NPU_LORA_RESOURCE_NAMESPACE": "a", "NPU_LORA_RESOURCE_UID": "uid-a2"},
    )
    case(
        "a/same-name re-created again (uid A3) with spec.resumeFrom: its own directory",
        manifest(name="same-name", resumeFrom=shared.name, training={"steps": 8}),
        out=shared,
        env={"NPU_LORA_RESOURCE_NAMESPACE": "a", "NPU_LORA_RESOURCE_UID": "uid-a3"},
    )
    case(
        "b/same-name (uid B) with spec.resumeFrom: a's moved-aside directory, own --out",
        manifest(name="same-name", resumeFrom=f"{shared.name}.prev-uid-a", training={"steps": 8}),
        out=tmp / "b-run",
        env={"NPU_LORA_RESOURCE_NAMESPACE": "b", "NPU_LORA_RESOURCE_UID": "uid-b"},
    )

    out_md = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    table = [
        "| case | exit | message (first line) | wall s | run directory after |",
        "|---|---|---|---|---|",
    ]
    for t, c, m, dt, lst in rows:
        table.append(f"| {t} | {c} | {m.replace('|', '/')} | {dt:.2f} | {lst} |")
    text = "\n".join(table) + "\n"
    print(text)
    if out_md:
        out_md.write_text(text)


if __name__ == "__main__":
    main()
