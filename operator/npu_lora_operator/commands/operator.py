"""``npu-lora operator``: run the kopf operator (MoEFinetune → Job), standalone, one replica."""

from __future__ import annotations

import argparse
import logging

from npu_lora_operator.settings import default_liveness, default_log_level, watched_namespaces


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=None,
        help="watch this namespace (repeatable; default: $NPU_LORA_NAMESPACES, comma-separated, "
        "or all namespaces)",
    )
    parser.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch all namespaces (cluster-wide)"
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, $KUBECONFIG)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=default_liveness(),
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument("--worker-image", help="worker image when spec.image is unset")
    parser.add_argument(
        "--worker-command",
        help="worker executable, JSON list or shell words (default: npu-lora); "
        "`run CONFIG --out DIR` is appended",
    )
    parser.add_argument(
        "--image-pull-policy", choices=["IfNotPresent", "Always", "Never"], default=None
    )
    parser.add_argument(
        "--standalone",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run without kopf peering (default; the chart runs one replica with Recreate). "
        "--no-standalone enables peering (needs kopf's peering CRD)",
    )
    parser.add_argument(
        "--log-level",
        default=default_log_level(),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )


def namespaces_from(args: argparse.Namespace) -> list[str]:
    return watched_namespaces(args.namespace, all_namespaces=getattr(args, "all_namespaces", False))


def config_from(args: argparse.Namespace):
    from npu_lora_operator.settings import OperatorConfig, parse_command

    return OperatorConfig.from_env(
        worker_image=args.worker_image,
        worker_command=parse_command(args.worker_command) if args.worker_command else None,
        image_pull_policy=args.image_pull_policy,
    )


def run(args: argparse.Namespace) -> int:
    import kopf

    from npu_lora_operator import handlers
    from npu_lora_operator.kube import load_config

    level = getattr(logging, args.log_level)
    kopf.configure(debug=level <= logging.DEBUG, verbose=level <= logging.INFO)
    logging.getLogger().setLevel(level)
    from npu_lora_operator.handlers import quiet_kopf_logs

    quiet_kopf_logs()
    for noisy in ("aiohttp.access", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    load_config(args.kubeconfig, args.context)
    memo = handlers.new_memo(config_from(args))
    namespaces = namespaces_from(args)
    logging.getLogger("npu_lora_operator").info(
        "watching %s", ", ".join(namespaces) if namespaces else "all namespaces"
    )
    kopf.run(
        registry=handlers.registry,
        settings=handlers.build_settings(),
        standalone=args.standalone,
        peering_name="npu-lora-operator" if not args.standalone else None,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
        memo=memo,
    )
    return 0
