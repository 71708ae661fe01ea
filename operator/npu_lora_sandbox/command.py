"""``npu-lora sandbox``: a Kubernetes API emulator, a local kubelet and the operator in one process.

For trying the operator with the real ``kubectl`` on a laptop, without a cluster::

    npu-lora sandbox --root .sandbox          # prints the KUBECONFIG to export
    export KUBECONFIG=.sandbox/admin/kubeconfig
    kubectl apply -f examples/tiny-sandbox.yaml
    kubectl get mft -w

The emulator serves the MoEFinetune CRD (generated from the models, with schema validation and
CEL) and authenticates as a cluster does: the user's kubeconfig carries the sandbox admin's
random token, the operator runs as its own ServiceAccount under the chart's ClusterRole, each
worker pod's kubeconfig carries its ServiceAccount's token (see :mod:`.auth`). The kubelet runs each Job's worker as a local subprocess (PVC ``runs`` is the directory
``<root>/pvc/<namespace>/runs``) and the operator runs in a thread with its own event loop. The worker
command is this interpreter's ``python -m npu_lora.cli`` (the kubelet maps ``python`` to
``sys.executable``), so the pods run this checkout's ``npu-lora run``.

``--runtime podman`` runs what a cluster would run instead: each pod's container from its image
with podman (:mod:`.podman`: its user, read-only root, capabilities, limits and volumes), the
worker image ``localhost/npu-lora-worker:VERSION`` with its own entrypoint, and the operator from
``localhost/npu-lora-operator:VERSION`` in a container on the host network
(``--operator-in-process`` keeps it in this process). Build both with ``scripts/build-images.sh``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

SANDBOX_WORKER_COMMAND = ("python", "-m", "npu_lora.cli")
SANDBOX_WORKER_IMAGE = "npu-lora-worker:sandbox"
#: where the in-sandbox operator's identity lives (as the chart installs it)
OPERATOR_NAMESPACE = "npu-lora-system"
OPERATOR_ACCOUNT = "npu-lora-operator"
CHART_RBAC = (
    Path(__file__).resolve().parents[2] / "charts" / "npu-lora-operator" / "templates" / "rbac.yaml"
)


def chart_operator_rules(path: Path = CHART_RBAC) -> list[dict[str, Any]]:
    """The rules of the chart's operator ClusterRole, read from ``templates/rbac.yaml`` (its
    ``rules:`` block is plain YAML; tests/ship checks it equals Helm's render)."""
    text = path.read_text()
    start = text.index("\nrules:\n") + len("\nrules:\n")
    end = text.index("{{", start)
    rules = yaml.safe_load(text[start:end])
    if not isinstance(rules, list) or not rules:
        raise ValueError(f"{path}: no ClusterRole rules found")
    return rules


def install_operator_identity(emu: Any, kubeconfig: Path) -> Path:
    """Create the operator's ServiceAccount, the chart's ClusterRole and a ClusterRoleBinding
    (as ``helm install`` does with the default values) and write a kubeconfig carrying that
    ServiceAccount's token: the sandbox's operator runs under the chart's RBAC."""
    rbac = "rbac.authorization.k8s.io"
    emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NAMESPACE}})
    sa = {"name": OPERATOR_ACCOUNT, "namespace": OPERATOR_NAMESPACE}
    emu.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": sa})
    emu.create(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRole",
            "metadata": {"name": OPERATOR_ACCOUNT},
            "rules": chart_operator_rules(),
        }
    )
    emu.create(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": OPERATOR_ACCOUNT},
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": OPERATOR_ACCOUNT},
            "subjects": [{"kind": "ServiceAccount", **sa}],
        }
    )
    return emu.write_kubeconfig(  # type: ignore[no-any-return]
        kubeconfig, service_account=(OPERATOR_NAMESPACE, OPERATOR_ACCOUNT)
    )


def _image(target: str) -> str:
    from npu_lora import __version__

    return f"localhost/npu-lora-{target}:{__version__}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="where to write the sandbox's kubeconfig (default: ROOT/admin/kubeconfig, in a 0700 directory no pod is given)",
    )
    parser.add_argument(
        "--root",
        metavar="DIR",
        default=".sandbox",
        help="state directory: pvc/<namespace>/<claim> volumes, pods/<ns>_<pod> logs (default: .sandbox)",
    )
    parser.add_argument("--port", type=int, default=0, help="API port (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="API address (default: 127.0.0.1)")
    parser.add_argument(
        "--no-operator", action="store_true", help="do not start the operator (run your own)"
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument(
        "--runtime",
        choices=["subprocess", "podman"],
        default="subprocess",
        help="how pods run: subprocess (default: this checkout's Python, paths rewritten) or "
        "podman (each pod's image as a real container; see scripts/build-images.sh)",
    )
    parser.add_argument(
        "--worker-image",
        metavar="IMAGE",
        help="worker image of the runs (default: npu-lora-worker:sandbox; with --runtime "
        f"podman: {_image('worker')})",
    )
    parser.add_argument(
        "--operator-image",
        metavar="IMAGE",
        help=f"with --runtime podman, the operator's image (default: {_image('operator')})",
    )
    parser.add_argument(
        "--operator-in-process",
        action="store_true",
        help="with --runtime podman, run the operator in this process instead of its image",
    )
    parser.add_argument(
        "--node-label",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a label of the sandbox's node, added to or replacing its defaults (repeatable; "
        "e.g. the product label of the backend registry's feature discovery, to try "
        "spec.device.product)",
    )


class OperatorThread:
    """The kopf operator in a background thread with its own event loop."""

    def __init__(self, memo: Any, namespaces: list[str] | None = None) -> None:
        self.memo = memo  # handlers.new_memo(...)
        self.namespaces = list(namespaces or [])
        self.stop_flag = threading.Event()
        self.ready_flag = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="npu-lora-operator", daemon=True)

    def _run(self) -> None:
        import kopf
        from npu_lora_operator import handlers

        try:
            asyncio.run(
                kopf.operator(
                    registry=handlers.registry,
                    settings=handlers.build_settings(),
                    standalone=True,
                    clusterwide=not self.namespaces,
                    namespaces=self.namespaces,
                    stop_flag=self.stop_flag,
                    ready_flag=self.ready_flag,
                    memo=self.memo,
                )
            )
        except BaseException as e:  # reported by start()/the main loop
            self.error = e
            self.ready_flag.set()

    def start(self, timeout: float = 60) -> OperatorThread:
        self.thread.start()
        self.ready_flag.wait(timeout)
        if self.error is not None:
            raise RuntimeError(f"the operator failed to start: {self.error!r}") from self.error
        return self

    def stop(self, timeout: float = 15) -> None:
        self.stop_flag.set()
        self.thread.join(timeout)

    def is_alive(self) -> bool:
        return self.thread.is_alive()


def start_sandbox(
    root: str | Path,
    *,
    kubeconfig: str | Path | None = None,
    port: int = 0,
    host: str = "127.0.0.1",
    operator: bool = True,
    runtime: str = "subprocess",
    worker_image: str | None = None,
    operator_image: str | None = None,
    operator_in_process: bool = False,
    node_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start emulator + CRD + kubelet (+ operator). Returns the parts; stop with
    :func:`stop_sandbox`. ``runtime="podman"``: pods run in containers from their images and the
    operator from ``operator_image`` (unless ``operator_in_process``)."""
    import kubernetes
    from npu_lora_operator import handlers
    from npu_lora_operator.crd import build_crd
    from npu_lora_operator.settings import OperatorConfig

    from npu_lora_sandbox.emulator import ApiEmulator
    from npu_lora_sandbox.kubelet import LocalKubelet

    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if runtime not in ("subprocess", "podman"):
        raise ValueError(f"runtime: {runtime!r} is not one of 'subprocess', 'podman'")
    pod_runtime = None
    if runtime == "podman":
        from npu_lora_sandbox.podman import PodmanRuntime, podman_available

        why = podman_available()
        if why:
            raise RuntimeError(f"--runtime podman: {why}")
        pod_runtime = PodmanRuntime()
    emu = ApiEmulator(port=port, host=host).start()
    emu.load_crd(build_crd())
    kubelet = LocalKubelet(emu, root=root, runtime=pod_runtime, node_labels=node_labels).start()
    kc = Path(kubeconfig).resolve() if kubeconfig else kubelet.kubeconfig
    emu.write_kubeconfig(kc)
    # no pod's hostPath or environment may reach the admin kubeconfig, wherever it was written
    kubelet.private_paths = (kubelet.private_dir, kc)
    parts: dict[str, Any] = {
        "emulator": emu,
        "kubelet": kubelet,
        "kubeconfig": kc,
        "root": root,
        "runtime": runtime,
    }
    if runtime == "podman":
        # the worker image's own entrypoint (npu-lora), as on a cluster
        worker_image = worker_image or _image("worker")
        command: tuple[str, ...] | None = None
    else:
        worker_image = worker_image or SANDBOX_WORKER_IMAGE
        command = SANDBOX_WORKER_COMMAND
    parts["worker_image"] = worker_image
    op_kc = None
    if operator:
        op_kc = install_operator_identity(emu, kubelet.private_dir / "operator-kubeconfig")
        parts["operator_kubeconfig"] = op_kc
    if op_kc is not None and runtime == "podman" and not operator_in_process:
        from npu_lora_sandbox.podman import OperatorContainer

        parts["operator_image"] = operator_image or _image("operator")
        try:
            parts["operator"] = OperatorContainer(
                parts["operator_image"],
                op_kc,
                root / "operator.log",
                worker_image=worker_image,
            ).start()
        except BaseException:
            kubelet.stop()
            emu.stop()
            raise
    elif op_kc is not None:
        kubernetes.config.load_kube_config(config_file=str(op_kc))
        overrides: dict[str, Any] = {"worker_command": command} if command else {}
        memo = handlers.new_memo(
            OperatorConfig(worker_image=worker_image, image_pull_policy="Never", **overrides)
        )
        parts["operator"] = OperatorThread(memo).start()
    return parts


def banner_columns(*, wide: bool) -> list[str]:
    """The ``kubectl get mft`` column names the banner lists, from the CRD's printer columns
    (so it never drifts from what kubectl prints): the default ones, or those only ``-o wide``
    adds."""
    from npu_lora_operator.crd import PRINTER_COLUMNS

    return [
        str(c["name"]).upper()
        for c in PRINTER_COLUMNS
        if bool(c.get("priority")) == wide and (wide or c["name"] != "Age")
    ]


def stop_sandbox(parts: dict[str, Any]) -> None:
    op = parts.get("operator")
    if op is not None:
        op.stop()
    parts["kubelet"].stop()
    parts["emulator"].stop()


#: seconds a shutdown may take after SIGTERM/SIGINT before the process exits regardless
SHUTDOWN_GRACE = 20.0


def _arm_watchdog(grace: float, code: int) -> threading.Timer:
    """Exit the process with ``code`` after ``grace`` seconds unless it has exited by then
    (a wedged controller, a hung request or a child that ignores SIGTERM cannot keep it)."""

    def _exit() -> None:
        print(f"npu-lora sandbox: shutdown took longer than {grace:.0f}s; exiting", file=sys.stderr)
        sys.stderr.flush()
        os._exit(code)

    t = threading.Timer(grace, _exit)
    t.daemon = True
    t.start()
    return t


def _node_labels(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--node-label {item!r}: use KEY=VALUE")
        out[key] = value
    return out


def run(args: argparse.Namespace) -> int:
    import kopf

    level = getattr(logging, args.log_level)
    kopf.configure(debug=level <= logging.DEBUG, verbose=level <= logging.INFO)
    logging.getLogger().setLevel(level)
    from npu_lora_operator.handlers import quiet_kopf_logs

    quiet_kopf_logs()
    for noisy in ("aiohttp.access", "urllib3", "kmock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # "OS signals are ignored: running not in the main thread": expected, the sandbox handles them
    logging.getLogger("kopf._core.reactor.running").setLevel(logging.ERROR)

    done = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        if done.is_set():  # a second signal: stop now
            os._exit(128 + signum)
        done.set()
        _arm_watchdog(SHUTDOWN_GRACE, 128 + signum)

    # before anything starts: a SIGTERM during start-up or a wedged shutdown still stops it
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    parts = start_sandbox(
        args.root,
        kubeconfig=args.kubeconfig,
        port=args.port,
        host=args.host,
        operator=not args.no_operator,
        runtime=args.runtime,
        worker_image=args.worker_image,
        operator_image=args.operator_image,
        operator_in_process=args.operator_in_process,
        node_labels=_node_labels(args.node_label),
    )
    kc = parts["kubeconfig"]
    examples = Path(__file__).resolve().parents[2] / "examples" / "tiny-sandbox.yaml"
    example = str(examples) if examples.exists() else "examples/tiny-sandbox.yaml"
    if "operator" not in parts:
        op_line = "not started (--no-operator)"
    elif "operator_image" in parts:
        op_line = f"container from {parts['operator_image']} (log: {parts['root']}/operator.log)"
    else:
        op_line = "running (in this process)"
    if parts["runtime"] == "podman":
        worker_line = f"container from {parts['worker_image']} (podman)"
    else:
        worker_line = f"{' '.join(SANDBOX_WORKER_COMMAND)} run ... (local subprocess)"
    print(
        f"npu-lora sandbox: API at {parts['emulator'].url}, state in {parts['root']}\n"
        f"  operator: {op_line}; worker: {worker_line}\n\n"
        f"  export KUBECONFIG={kc}\n"
        f"  kubectl apply -f {example}\n"
        f"  kubectl get mft -w            # {', '.join(banner_columns(wide=False))}\n"
        f"  kubectl get mft -o wide       # and {', '.join(banner_columns(wide=True))}\n"
        f"  kubectl describe mft tiny-sandbox; kubectl logs job/tiny-sandbox\n"
        f"  ls {parts['kubelet'].pvc_dir('runs', 'default') / 'tiny-sandbox'}\n\n"
        "Ctrl-C stops everything.",
        flush=True,
    )
    if done.is_set():
        stop_sandbox(parts)
        return 0
    try:
        while not done.wait(1.0):
            op = parts.get("operator")
            if op is not None and not op.is_alive():
                print(f"npu-lora sandbox: the operator stopped: {op.error!r}", file=sys.stderr)
                break
    finally:
        stop_sandbox(parts)
    return 0
