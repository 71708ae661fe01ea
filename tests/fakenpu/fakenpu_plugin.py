"""The one register line of ``fakenpu`` (:mod:`fakenpu_backend`), loaded as a pytest plugin
(``-p fakenpu_plugin``) so it runs before anything imports the API models, as the line in
``npu_lora/api/backends.py`` would."""

from npu_lora.api.backends import BackendEntry, NodeFacts, register

register(BackendEntry("fakenpu", "fakenpu_backend:FakeNpuBackend", cards=True, resource="fakenpu.example/card", summary="a test-only NPU the host stands in for", host=True, compile_device="cpu", cache_folder="fakenpu-cache", node_keys=("fakenpu.example/*",), taint_keys=("fakenpu.example/card",), sandbox_cards=2, node=NodeFacts(family_label="fakenpu.example/family", family="fakenpu", product_label="fakenpu.example/product", products=("fakenpu-1",))))  # fmt: skip
