"""The worker's StatusReporter: throttling, non-blocking, retries, only its status subtree."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from npu_lora.report.status import WORKER_KEYS, StatusReporter, last_step_status
from npu_lora_operator.crd import build_crd
from testkit import free_port


def record(step: int, **kw: Any) -> dict[str, Any]:
    return {
        "step": step,
        "loss": 6.123456789,
        "step_s": 0.5 + 0.01 * step,
        "attn_head_s": 0.123456,
        "host_fwd_s": 0.2,
        "host_bwd_s": 0.15,
        "recompute_s": 0.0,
        "device_calls_per_layer": 2.0,
        "tokens": 128,
        "hot_experts": 4,
        "placement": "hot",
        **kw,
    }


class FakeApi:
    """Records patches; fails the first ``failures`` calls with the given exceptions."""

    def __init__(self, failures: list[BaseException] | None = None, delay: float = 0.0):
        self.failures = list(failures or [])
        self.calls: list[dict[str, Any]] = []
        self.ok: list[dict[str, Any]] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> None:
        with self.lock:
            self.calls.append(body)
            exc = self.failures.pop(0) if self.failures else None
        if self.delay:
            time.sleep(self.delay)
        if exc is not None:
            raise exc
        with self.lock:
            self.ok.append(body)


def test_last_step_status_maps_and_rounds() -> None:
    out = last_step_status(record(3, loss=float("nan")))
    assert out == {
        "step": 3,
        "stepS": 0.53,
        "attnHeadS": 0.1235,
        "hostFwdS": 0.2,
        "hostBwdS": 0.15,
        "recomputeS": 0.0,
        "deviceCallsPerLayer": 2.0,
        "tokens": 128,
    }


def test_throttling_every_steps_and_interval() -> None:
    api = FakeApi()
    clock = [0.0]
    rep = StatusReporter(
        "r1",
        total_steps=10,
        every_steps=2,
        min_interval_seconds=5,
        patch=api,
        clock=lambda: clock[0],
    )
    rep.on_start(SimpleNamespace(total_steps=10, start_step=1))
    submitted = []
    for step in range(1, 11):
        clock[0] += 1.0
        before = rep._version
        rep.on_step(record(step), None)
        if rep._version != before:
            submitted.append(step)
    # every 2nd step, at least 5 s apart; the last step always
    assert submitted == [6, 10]
    rep.on_end({}, None)
    statuses = [c["status"] for c in api.ok]
    assert statuses[-1]["progress"]["step"] == 10
    assert statuses[-1]["progress"]["totalSteps"] == 10
    assert statuses[-1]["progress"]["percent"] == 100.0
    assert statuses[-1]["lastStep"]["loss"] == 6.1235
    assert set(statuses[-1]) <= set(WORKER_KEYS)


def test_hot_and_checkpoint_and_median() -> None:
    api = FakeApi()
    rep = StatusReporter("r1", total_steps=6, warmup_steps=2, min_interval_seconds=0, patch=api)
    rep.on_start(SimpleNamespace(total_steps=6, start_step=1))
    for step in range(1, 7):
        rep.on_step(record(step, step_s=10.0 if step <= 2 else 1.0), None)
        if step == 2:
            rep.on_hot_selected({"fraction": 0.25, "experts": 4, "selected_at_step": 2}, None)
        if step == 4:
            rep.on_checkpoint(4, "/mnt/output/r1/checkpoint", None)
    rep.on_end({}, None)
    last = api.ok[-1]["status"]
    assert last["hot"] == {"fraction": 0.25, "experts": 4, "selectedAtStep": 2}
    assert last["lastCheckpoint"]["step"] == 4
    assert last["stepSecondsMedian"] == 1.0  # warm-up steps excluded
    assert last["progress"]["etaSeconds"] == 0


def test_failures_are_retried_and_never_raise() -> None:
    failures: list[BaseException] = [
        ApiException(status=409, reason="Conflict"),
        ApiException(status=500, reason="Internal Server Error"),
        ApiException(status=503, reason="Service Unavailable"),
        ConnectionError("connection refused"),
    ]
    api = FakeApi(failures, delay=0.3)  # each API call takes 0.3 s
    rep = StatusReporter(
        "r1",
        total_steps=5,
        min_interval_seconds=0,
        patch=api,
        retry_seconds=0.01,
        max_retry_seconds=0.05,
    )
    rep.on_start(SimpleNamespace(total_steps=5, start_step=1))
    for step in range(1, 6):
        t0 = time.perf_counter()
        rep.on_step(record(step), None)
        # never waits for the API (a blocking call would take >= 0.3 s; the bound leaves a
        # loaded 2-core CI host its scheduling delays)
        assert time.perf_counter() - t0 < 0.1
    rep.on_end({}, None)
    assert rep.failures == 4
    # the latest state won and was written
    assert api.ok[-1]["status"]["progress"]["step"] == 5


def test_flush_gives_up_when_api_is_down() -> None:
    api = FakeApi([ConnectionError("down")] * 10_000)
    rep = StatusReporter("r1", total_steps=2, patch=api, retry_seconds=0.01, flush_timeout=0.5)
    rep.on_start(SimpleNamespace(total_steps=2, start_step=1))
    rep.on_step(record(1), None)
    t0 = time.perf_counter()
    rep.on_error("boom", 1, None)  # must not raise
    assert time.perf_counter() - t0 < 3


def test_real_client_network_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        f"clusters: [{{name: x, cluster: {{server: 'http://127.0.0.1:{free_port()}'}}}}]\n"
        "users: [{name: x, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: x, user: x}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kc))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    rep = StatusReporter("r1", total_steps=1, retry_seconds=0.05, flush_timeout=1.0)
    rep.on_start(SimpleNamespace(total_steps=1, start_step=1))
    rep.on_step(record(1), None)
    # the sender thread's first attempt (the client's set-up included) may take seconds on a
    # loaded machine: wait for it, then a flush against the closed port must give up
    deadline = time.monotonic() + 30
    while rep.failures < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rep.failures >= 1
    assert rep.flush(1.0) is False
    rep.close(0.2)


def test_against_emulator_patches_only_worker_keys(
    emulator: Any, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator.load_crd(build_crd())
    emulator.create(
        {
            "apiVersion": "npu-lora.io/v1alpha1",
            "kind": "MoEFinetune",
            "metadata": {"name": "r1", "namespace": "default"},
            "spec": {
                "model": {"preset": "tiny-qwen3-moe"},
                "data": {"path": "example:nsmc-mini"},
                "training": {"steps": 3},
                "moe": {"warmupSteps": 1},
            },
        }
    )
    emulator.patch(
        "npu-lora.io/v1alpha1",
        "MoEFinetune",
        "r1",
        {"status": {"phase": "Running", "message": "operator"}},
        namespace="default",
        subresource="status",
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("NPU_LORA_RESOURCE_NAME", "r1")
    monkeypatch.setenv("NPU_LORA_RESOURCE_NAMESPACE", "default")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    rep = StatusReporter.from_env(None, total_steps=3, min_interval_seconds=0)
    rep.on_start(SimpleNamespace(total_steps=3, start_step=1))
    for step in (1, 2, 3):
        rep.on_step(record(step), None)
    rep.on_hot_selected({"fraction": 0.25, "experts": 4, "selected_at_step": 1}, None)
    rep.on_end({}, None)
    assert rep.failures == 0
    obj = emulator.get("npu-lora.io/v1alpha1", "MoEFinetune", "r1", namespace="default")
    status = obj["status"]
    assert status["phase"] == "Running" and status["message"] == "operator"  # untouched
    assert status["progress"]["step"] == 3 and status["lastStep"]["hostFwdS"] == 0.2
    assert status["hot"]["experts"] == 4


def test_against_emulator_missing_object_is_not_fatal(
    emulator: Any, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    emulator.load_crd(build_crd())
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    # not the worker's main loop: no SIGTERM handler (one left by an earlier in-process test
    # would make the reporter's "run deleted" path stop this process)
    old_handler = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rep = StatusReporter("gone", total_steps=1, retry_seconds=0.05, flush_timeout=0.5)
    rep.on_start(SimpleNamespace(total_steps=1, start_step=1))
    rep.on_step(record(1), None)
    try:
        rep.on_end({}, None)  # 404s: logged, not raised
    finally:
        signal.signal(signal.SIGTERM, old_handler)
    assert rep.failures >= 1


class FlakyServer:
    """A tiny aiohttp API that answers PATCH .../status with 409, 500, 503, then 200."""

    def __init__(self) -> None:
        self.codes = [409, 500, 503]
        self.bodies: list[dict[str, Any]] = []
        self.content_types: list[str] = []
        self.port = free_port()
        self._ready = threading.Event()
        self._stop: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import asyncio

        from aiohttp import web

        async def patch(request: web.Request) -> web.Response:
            self.content_types.append(request.headers.get("Content-Type", ""))
            body = await request.json()
            code = self.codes.pop(0) if self.codes else 200
            if code != 200:
                return web.json_response(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "code": code,
                        "reason": "Conflict" if code == 409 else "InternalError",
                        "message": "x",
                    },
                    status=code,
                )
            self.bodies.append(body)
            return web.json_response({"apiVersion": "npu-lora.io/v1alpha1", **body})

        async def main() -> None:
            app = web.Application()
            app.router.add_patch(
                "/apis/npu-lora.io/v1alpha1/namespaces/{ns}/moefinetunes/{name}/status", patch
            )
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()
            await runner.cleanup()

        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(main())

    def __enter__(self) -> FlakyServer:
        self.thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(5)


def test_real_client_retries_409_and_5xx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FlakyServer() as srv:
        kc = tmp_path / "kubeconfig"
        kc.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
            f"clusters: [{{name: x, cluster: {{server: 'http://127.0.0.1:{srv.port}'}}}}]\n"
            "users: [{name: x, user: {token: t}}]\n"
            "contexts: [{name: x, context: {cluster: x, user: x}}]\n"
        )
        monkeypatch.setenv("KUBECONFIG", str(kc))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        rep = StatusReporter(
            "r1",
            "ns1",
            total_steps=3,
            min_interval_seconds=0,
            retry_seconds=0.02,
            max_retry_seconds=0.1,
        )
        rep.on_start(SimpleNamespace(total_steps=3, start_step=1))
        for step in (1, 2, 3):
            rep.on_step(record(step), None)
        rep.on_end({}, None)
        assert rep.failures == 3
        assert srv.bodies and srv.bodies[-1]["status"]["progress"]["step"] == 3
        assert all(ct.startswith("application/merge-patch+json") for ct in srv.content_types)
        assert set(srv.bodies[-1]["status"]) <= set(WORKER_KEYS)


def test_host_choice_with_warning_is_reported_at_start() -> None:
    """``status.host``: the resolved host dtype/kernel; an explicit bf16 known to be slow on an
    AVX2-only CPU carries its warning (the probe is given, so this runs on any CPU)."""
    from npu_lora.api.v1alpha1 import HostStatus
    from npu_lora.moe.host_dtype import resolve_host_dtype

    caps = {"native_bf16": False, "isa": ["avx2", "fma"]}
    choice = resolve_host_dtype("bfloat16", "grouped_mm", caps=caps, log_it=False)
    assert choice.dtype == "bfloat16" and "without native bf16" in (choice.warning or "")
    assert resolve_host_dtype("auto", "grouped_mm", caps=caps, log_it=False).dtype == "float32"
    assert resolve_host_dtype("float32", "grouped_mm", caps=caps, log_it=False).warning is None
    api = FakeApi()
    rep = StatusReporter("r1", total_steps=2, patch=api)
    rep.on_start(SimpleNamespace(total_steps=2, start_step=1, extra={"host": choice.status()}))
    rep.on_end({}, None)
    host = api.ok[-1]["status"]["host"]
    assert host["dtype"] == "bfloat16" and host["warning"] == choice.warning
    HostStatus.model_validate(host)  # the CRD's schema accepts it
    assert set(api.ok[-1]["status"]) <= set(WORKER_KEYS)


def test_eval_is_reported_at_once_with_the_best_and_validates_against_the_model() -> None:
    from npu_lora.api.v1alpha1 import MoEFinetuneStatus

    api = FakeApi()
    rep = StatusReporter(
        "r1", total_steps=10, every_steps=100, min_interval_seconds=1000, patch=api
    )
    rep.on_start(SimpleNamespace(total_steps=10, start_step=1, extra={}))
    rep.on_step(record(4), None)
    ev = {
        "step": 4,
        "loss": 0.6931234567,
        "perplexity": 2.0000123,
        "accuracy": 0.75,
        "examples": 1000,
        "tokens": 3000,
        "seconds": 12.345678,
        "best": True,
    }
    ctx = SimpleNamespace(extra={"eval": {**ev, "best": {"step": 2, "loss": 0.61}}})
    rep.on_eval(ev, ctx)
    assert rep.flush(5)
    status = api.ok[-1]["status"]
    assert status["eval"] == {
        "step": 4,
        "loss": 0.69312,
        "perplexity": 2.0,
        "accuracy": 0.75,
        "seconds": 12.346,
        "examples": 1000,
        "best": {"step": 2, "loss": 0.61},
    }
    assert set(status) <= set(WORKER_KEYS)
    MoEFinetuneStatus.model_validate(status)
    rep.close(5)


def test_auto_keeping_host_only_reports_no_hot_experts() -> None:
    """HOT counts experts that run on the device: when ``auto`` keeps host-only after its trials,
    the hot set chosen for the trial is no longer in use and HOT reads 0."""
    api = FakeApi()
    rep = StatusReporter("r1", total_steps=8, min_interval_seconds=0, patch=api)
    rep.on_start(SimpleNamespace(total_steps=8, start_step=1))
    rep.on_step(record(1), None)
    rep.on_hot_selected({"fraction": 0.25, "experts": 4, "selected_at_step": 1}, None)
    rep.on_placement({"policy": "auto", "chosen": "host-only", "decided_at_step": 7}, None)
    rep.on_step(record(8), None)
    rep.on_end({}, None)
    last = api.ok[-1]["status"]
    assert last["hot"]["experts"] == 0 and last["placement"]["chosen"] == "host-only"


def test_trainer_status_has_kubeflow_trainer_names_and_meanings(
    emulator: Any, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``status.trainerStatus`` as Kubeflow Trainer KEP-2779 names it: an integer percentage
    from the steps, the ETA as integer seconds, the fixed metrics with string values, the time
    of the observation; it passes the CRD's schema and our own fields stay beside it."""
    from npu_lora.api import record as step_record
    from npu_lora.api.v1alpha1 import MoEFinetuneStatus

    emulator.load_crd(build_crd())
    emulator.create(
        {
            "apiVersion": "npu-lora.io/v1alpha1",
            "kind": "MoEFinetune",
            "metadata": {"name": "r1", "namespace": "default"},
            "spec": {
                "model": {"preset": "tiny-qwen3-moe"},
                "data": {"path": "example:nsmc-mini"},
                "training": {"steps": 8},
                "moe": {"warmupSteps": 1},
            },
        }
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("NPU_LORA_RESOURCE_NAME", "r1")
    monkeypatch.setenv("NPU_LORA_RESOURCE_NAMESPACE", "default")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    rep = StatusReporter.from_env(None, total_steps=8, min_interval_seconds=0)
    rep.on_start(SimpleNamespace(total_steps=8, start_step=1, extra={}))
    for step in (1, 2, 3):
        rep.on_step(record(step, step_s=2.0, tokens=256, loss=1.234567891), None)
    assert rep.flush(5)
    get = lambda: emulator.get("npu-lora.io/v1alpha1", "MoEFinetune", "r1", namespace="default")  # noqa: E731
    ts = get()["status"]["trainerStatus"]
    assert set(ts) == {
        "progressPercentage",
        "estimatedRemainingSeconds",
        "metrics",
        "lastUpdatedTime",
    }
    assert ts["progressPercentage"] == 37  # 3 of 8 steps, floored as an int32 percentage
    assert ts["estimatedRemainingSeconds"] == 10  # 5 steps × 2.0 s (median)
    assert ts["metrics"] == [
        {"name": "loss", "value": "1.2346"},
        {"name": "step_seconds", "value": "2"},
        {"name": "tokens_per_second", "value": "128"},
    ]
    assert ts["lastUpdatedTime"] == get()["status"]["progress"]["lastUpdateTime"]
    # after an evaluation: eval_loss and eval_accuracy join, in the registry's order
    rep.on_eval(
        {"step": 3, "loss": 0.5, "accuracy": 0.8125, "examples": 16}, SimpleNamespace(extra={})
    )
    for step in range(4, 9):
        rep.on_step(record(step, step_s=2.0, tokens=256), None)
    rep.on_end({}, None)
    status = get()["status"]
    ts = status["trainerStatus"]
    assert ts["progressPercentage"] == 100 and ts["estimatedRemainingSeconds"] == 0
    names = [m["name"] for m in ts["metrics"]]
    assert names == [m.name for m in step_record.TRAINER_METRICS]
    assert {m["name"]: m["value"] for m in ts["metrics"]}["eval_accuracy"] == "0.8125"
    assert all(isinstance(m["value"], str) and m["value"] for m in ts["metrics"])
    assert status["progress"]["percent"] == 100.0 and status["lastStep"]["step"] == 8
    MoEFinetuneStatus.model_validate(status)
