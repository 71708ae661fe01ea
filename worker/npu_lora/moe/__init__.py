"""The MoE block on the host (HostMLP) and the hot experts on the device (the shape rules they
use, ``hot_count`` and the buckets, are ``npu_lora.api.sizing``)."""

from npu_lora.moe.host_mlp import HostMLP, HostMLPFunction, install_host_mlp
from npu_lora.moe.hot import (
    HotLayer,
    choose_bucket,
    hot_cold_forward,
    make_hot_layer,
    pick_bucket,
    refresh_hot_layer,
    select_hot,
)

__all__ = [
    "HostMLP",
    "HostMLPFunction",
    "HotLayer",
    "choose_bucket",
    "hot_cold_forward",
    "install_host_mlp",
    "make_hot_layer",
    "pick_bucket",
    "refresh_hot_layer",
    "select_hot",
]
