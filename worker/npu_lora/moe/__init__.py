"""The MoE block on the host (HostMLP) and the hot experts on the device."""

from npu_lora.moe.host_mlp import HostMLP, HostMLPFunction, install_host_mlp
from npu_lora.moe.hot import (
    HotLayer,
    choose_bucket,
    default_buckets,
    hot_cold_forward,
    hot_count,
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
    "default_buckets",
    "hot_cold_forward",
    "hot_count",
    "install_host_mlp",
    "make_hot_layer",
    "pick_bucket",
    "refresh_hot_layer",
    "select_hot",
]
