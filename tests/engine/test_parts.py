"""The engine is built from parts, each from its own spec section, and passes nothing on.

- ``HybridEngine.__init__`` takes the parts (model, backend, modes, hotset, adapter, hooks) and
  the build's facts: at most 8 parameters;
- no method of ``HybridEngine`` only forwards a call to a part (callers talk to the part:
  ``engine.hotset.summary()``, ``engine.adapter.save(path)``, ``engine.modes.set(mode)``);
- ``moe.hotFraction`` walks from the CRD to where it acts in 4 files with no climb back:
  ``api/v1alpha1/sections.py`` (the field) → ``engine/hotset.py`` (``HotSet.from_spec`` reads
  the ``moe`` section) → ``moe/hot.py`` (``select_hot(counts, fraction)``) →
  ``api/sizing.py`` (``hot_count``); the compile plan and the memory estimate read the same
  field from the spec and apply the same ``hot_count``. The test lists every module that names
  it, so a loose pass-through (a ``hot_fraction=`` handed from one layer to the next) fails it.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import npu_lora
from npu_lora.engine import HybridEngine

ROOT = Path(npu_lora.__file__).parent
HOT_FRACTION = {"hot_fraction", "hotFraction"}


def _names_hot_fraction(tree: ast.AST) -> bool:
    for n in ast.walk(tree):
        if (
            (isinstance(n, ast.Attribute) and n.attr in HOT_FRACTION)
            or (isinstance(n, ast.keyword) and n.arg in HOT_FRACTION)
            or (isinstance(n, ast.arg) and n.arg in HOT_FRACTION)
            or (isinstance(n, ast.Name) and n.id in HOT_FRACTION)
            or (isinstance(n, ast.Constant) and n.value in HOT_FRACTION)
        ):
            return True
    return False


def test_hot_fraction_walks_four_files_from_the_crd_to_where_it_acts():
    found = {
        f.relative_to(ROOT).as_posix()
        for f in ROOT.rglob("*.py")
        if _names_hot_fraction(ast.parse(f.read_text(encoding="utf-8")))
    }
    walk = {
        "api/v1alpha1/sections.py",  # the CRD field (MoESpec.hot_fraction)
        "engine/hotset.py",  # HotSet.from_spec(spec.moe, ...): fraction -> select_hot
    }
    same_rule = {
        "compile/plan.py",  # the hot graphs' Eh: api.sizing.hot_count(moe.hot_fraction, E)
        "api/memory.py",  # the device bytes of the hot experts: the same hot_count
    }
    bench_sweep = {  # the bench's own hotFractions sweep writes moe.hotFraction per case
        "api/v1alpha1/status.py",
        "bench/config.py",
        "bench/resource.py",
        "commands/bench.py",
    }
    rngd_catalogue = {  # rngd-check's own --hot-fraction for its tiny/real-width graphs
        "device/examples.py",
        "rngd/catalogue.py",
    }
    assert found == walk | same_rule | bench_sweep | rngd_catalogue
    # where it acts: the hot set hands the value to select_hot, which sizes it by hot_count
    hot = (ROOT / "moe/hot.py").read_text(encoding="utf-8")
    assert "from npu_lora.api.sizing import" in hot and "k = hot_count(fraction, E)" in hot
    src = inspect.getsource(npu_lora.engine.hotset.HotSet.from_spec)
    assert "moe.hot_fraction" in src


def test_the_engine_takes_its_parts_in_at_most_eight_parameters():
    params = [p for p in inspect.signature(HybridEngine.__init__).parameters if p != "self"]
    assert len(params) <= 8, params
    assert params[:6] == ["model", "backend", "modes", "hotset", "adapter", "hooks"]


def _forwards(fn: ast.FunctionDef) -> bool:
    """The body (docstring aside) is one ``return self.<part>.<name>`` or ``[return]
    self.<part>.<name>(<the method's own arguments, in order>)``."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Return | ast.Expr):
        return False
    value = body[0].value
    own = [a.arg for a in fn.args.args[1:]]
    if isinstance(value, ast.Call):
        args = [a.id for a in value.args if isinstance(a, ast.Name)]
        if len(args) != len(value.args) or args != own or value.keywords:
            return False
        value = value.func
    elif own:
        return False
    return (
        isinstance(value, ast.Attribute)
        and isinstance(value.value, ast.Attribute)
        and isinstance(value.value.value, ast.Name)
        and value.value.value.id == "self"
    )


def test_no_method_of_the_engine_only_forwards_a_call():
    tree = ast.parse((ROOT / "engine/hybrid.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "HybridEngine")
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    assert len(methods) > 10  # the check reads the real class
    assert [m.name for m in methods if _forwards(m)] == []


def test_the_forwarding_check_catches_a_pass_through():
    """The detector flags the shapes the engine used to have (so the test above can fail)."""
    src = '''
class E:
    def hot_summary(self):
        return self.hotset.summary()

    @property
    def policy(self):
        return self.modes.policy

    def save_adapter(self, path):
        """Doc."""
        self.adapter.save(path)

    def own(self, step):
        return self.hotset.refresh(step, self.modes.placement)
'''
    cls = ast.parse(src).body[0]
    assert isinstance(cls, ast.ClassDef)
    got = [n.name for n in cls.body if isinstance(n, ast.FunctionDef) and _forwards(n)]
    assert got == ["hot_summary", "policy", "save_adapter"]


def test_parts_are_built_from_their_sections(tiny):
    """``build_engine`` builds each part from its section: the hot set from ``moe`` (and the
    tokens per pass of ``training``), the mode control from ``moe`` + ``lora``."""
    from npu_lora.api.sizing import hot_buckets, tokens_per_pass
    from npu_lora.engine import build_engine

    spec = tiny.spec(
        moe={
            "placement": "auto",
            "hotFraction": 0.5,
            "warmupSteps": 2,
            "hotRefreshSteps": 3,
            "keepGraph": False,
        }
    )
    eng = build_engine(spec)
    hs, moe, t = eng.hotset, spec.moe, spec.training
    assert (hs.fraction, hs.warmup_steps, hs.refresh_steps, hs.memory) == (0.5, 2, 3, None)
    k = eng.config.num_experts_per_tok
    assert hs.buckets == hot_buckets(None, tokens_per_pass(t.batch_size, t.seq_len), k)
    assert eng.modes.policy == "auto" and eng.modes.mode.placement == "hot"
    assert eng.modes.keep_graph is False and moe.keep_graph is False
    assert eng.mlps is hs.mlps and eng.adapter.mlps is hs.mlps
