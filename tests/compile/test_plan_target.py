"""The compile plan's keys name the target product and the compiler release: a graph compiled
for one product (or by another compiler release) is a cache miss for another, never a hit."""

from __future__ import annotations

from pathlib import Path

from npu_lora.api import backends as registry
from npu_lora.compile import cache
from npu_lora.compile import plan as P

from .helpers import make_spec

NODE = registry.entry("furiosa").node
assert NODE is not None


def _furiosa(product: str | None = None):
    device = {"backend": "furiosa", "cards": 1}
    if product is not None:
        device["product"] = product
    return make_spec(device=device)


def test_two_plans_differing_only_in_product_have_different_keys() -> None:
    plans = {p: P.compile_plan(_furiosa(p)) for p in (None, *NODE.products)}
    names = {tuple(e.name for e in pl.entries) for pl in plans.values()}
    assert len(names) == 1, "the product changes no graph, only what it is compiled for"
    for a in plans:
        for b in plans:
            if a != b:  # every graph's key differs between any two targets
                assert not set(plans[a].keys) & set(plans[b].keys), (a, b)
    assert plans["rngd-max"].target == {"family": NODE.family, "product": "rngd-max"}
    assert plans[None].target == {"family": NODE.family, "product": None}
    assert plans["rngd-max"].to_dict()["target"]["product"] == "rngd-max"


def test_the_compiler_release_is_in_every_key() -> None:
    spec = _furiosa("rngd")
    a = P.compile_plan(spec, compiler="furiosa-torch==2026.4.0 torch==2.10.0")
    b = P.compile_plan(spec, compiler="furiosa-torch==2026.5.0 torch==2.10.0")
    assert not set(a.keys) & set(b.keys)
    assert P.compile_plan(spec).compiler.startswith("furiosa-torch==")


def test_a_backend_without_products_keeps_its_keys() -> None:
    """cpu/cuda graphs have no product: their plans carry no target and their keys do not
    change (a cache filled before this field stays valid)."""
    spec = make_spec()
    plan = P.compile_plan(spec)
    assert plan.target is None
    e = plan.entries[0]
    assert e.key == P.entry_key(e, compiler=plan.compiler, source=plan.source_digest)


def test_an_entry_of_another_product_is_a_miss(tmp_path: Path) -> None:
    """A cache filled for rngd answers a plan for rngd-max with misses only."""
    rngd, rmax = P.compile_plan(_furiosa("rngd")), P.compile_plan(_furiosa("rngd-max"))
    for key in rngd.keys:
        cache.publish(tmp_path, key, lambda tmp, key=key: {"key": key})
    assert all(cache.lookup(tmp_path, rngd.keys).values())
    assert not any(cache.lookup(tmp_path, rmax.keys).values())
