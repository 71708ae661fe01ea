"""Job/Pod state → the operator's status subtree."""

from __future__ import annotations

from typing import Any

from npu_lora_operator import status as st

NOW = "2026-01-01T00:00:00Z"


def mft(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "r1", "namespace": "default", "generation": 3},
        "spec": {"backoffLimit": 2},
        "status": status,
    }


def job(*conds: tuple[str, str], suspend: bool = False, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "r1", "uid": "j"},
        "spec": {"suspend": suspend},
        "status": {
            "conditions": [
                {"type": t, "status": "True", "reason": r, "lastTransitionTime": NOW, "message": ""}
                for t, r in conds
            ],
            **status,
        },
    }


def pod(name: str = "r1-abc", phase: str = "Running", ts: str = NOW, **cs: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": ts},
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase, "containerStatuses": [{"name": "worker", **cs}]},
    }


def conds(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_no_job_pending() -> None:
    s = st.compute_status(mft(), None, [], now=NOW)
    assert s["phase"] == "Pending"
    assert conds(s)["Queued"] == ("True", "JobPending")
    assert [c["type"] for c in s["conditions"]] == list(st.CONDITION_TYPES)
    assert s["observedGeneration"] == 3


def test_running() -> None:
    s = st.compute_status(mft(), job(active=1, startTime=NOW), [pod()], now=NOW)
    assert s["phase"] == "Running"
    assert conds(s)["Running"] == ("True", "PodRunning")
    assert conds(s)["Queued"][0] == "False"
    assert s["podName"] == "r1-abc" and s["nodeName"] == "n1" and s["jobName"] == "r1"
    assert s["startTime"] == NOW and s["attempts"] == 1


def test_succeeded() -> None:
    j = job(
        ("SuccessCriteriaMet", "CompletionsReached"),
        ("Complete", "CompletionsReached"),
        succeeded=1,
        completionTime="2026-01-01T00:05:00Z",
    )
    s = st.compute_status(mft(), j, [pod(phase="Succeeded")], now=NOW)
    assert s["phase"] == "Succeeded" and conds(s)["Succeeded"] == ("True", "Completed")
    assert conds(s)["Running"] == ("False", "Completed")
    assert s["completionTime"] == "2026-01-01T00:05:00Z"


def test_worker_error_exit_code_and_message() -> None:
    p = pod(
        phase="Failed",
        state={
            "terminated": {
                "exitCode": 2,
                "reason": "Error",
                "message": "exit 2: data file /mnt/data/x.tsv: no such file",
            }
        },
    )
    j = job(("FailureTarget", "PodFailurePolicy"), ("Failed", "PodFailurePolicy"), failed=1)
    s = st.compute_status(mft(), j, [p], now=NOW)
    assert s["phase"] == "Failed"
    assert conds(s)["Failed"] == ("True", "WorkerError")
    msg = s["message"]
    assert "code 2" in msg and "r1-abc" in msg and "no such file" in msg
    assert "invalid configuration" in msg
    assert s["completionTime"] == NOW


def test_backoff_limit_exceeded() -> None:
    pods = [
        pod(
            "r1-a",
            "Failed",
            "2026-01-01T00:00:01Z",
            state={"terminated": {"exitCode": 1, "message": "boom1"}},
        ),
        pod(
            "r1-b",
            "Failed",
            "2026-01-01T00:00:02Z",
            state={"terminated": {"exitCode": 1, "message": "boom2"}},
        ),
    ]
    j = job(("Failed", "BackoffLimitExceeded"), failed=2)
    s = st.compute_status(mft(), j, pods, now=NOW)
    assert conds(s)["Failed"] == ("True", "BackoffLimitExceeded")
    assert "boom2" in s["message"] and "2 attempt" in s["message"]
    assert s["attempts"] == 2 and s["podName"] == "r1-b"


def test_deadline_exceeded() -> None:
    j = job(("Failed", "DeadlineExceeded"))
    s = st.compute_status(mft(), j, [pod(phase="Failed")], now=NOW)
    assert conds(s)["Failed"] == ("True", "DeadlineExceeded")


def test_retrying_after_failed_pod() -> None:
    p = pod(phase="Failed", state={"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    s = st.compute_status(mft(), job(failed=1), [p], now=NOW)
    assert s["phase"] == "Running" and conds(s)["Running"] == ("True", "Retrying")
    assert "137" in s["message"]


def test_image_pull_backoff_and_unschedulable() -> None:
    p = pod(
        phase="Pending",
        state={"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}},
    )
    s = st.compute_status(mft(), job(active=1), [p], now=NOW)
    assert s["phase"] == "Pending" and conds(s)["Queued"] == ("True", "ImagePullBackOff")
    p = pod(phase="Pending")
    p["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/1 nodes: Insufficient furiosa.ai/rngd",
        }
    ]
    s = st.compute_status(mft(), job(), [p], now=NOW)
    assert conds(s)["Queued"] == ("True", "Unschedulable") and "rngd" in s["message"]


def test_suspended_and_kueue() -> None:
    m = mft()
    m["spec"]["suspend"] = True
    s = st.compute_status(m, job(("Suspended", "JobSuspended"), suspend=True), [], now=NOW)
    assert s["phase"] == "Suspended" and conds(s)["Suspended"] == ("True", "Suspended")
    m = mft()
    m["spec"]["queueName"] = "q"
    s = st.compute_status(m, job(suspend=True), [], now=NOW)
    assert s["phase"] == "Pending" and conds(s)["Queued"] == ("True", "WaitingForQueue")


def test_transition_time_kept_while_status_unchanged() -> None:
    first = st.compute_status(mft(), job(active=1), [pod()], now="2026-01-01T00:00:00Z")
    again = st.compute_status(mft(**first), job(active=1), [pod()], now="2026-01-01T01:00:00Z")
    assert first["conditions"] == again["conditions"]
    assert not st.status_changed(first, again)
    done = st.compute_status(
        mft(**first), job(("Complete", "x")), [pod(phase="Succeeded")], now="2026-01-01T02:00:00Z"
    )
    c = {x["type"]: x for x in done["conditions"]}
    assert c["Succeeded"]["lastTransitionTime"] == "2026-01-01T02:00:00Z"
    assert c["Queued"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"  # stayed False
    events = st.transition_events(first, done)
    assert events == [("Normal", "Completed", "Job r1 completed")]


def test_only_operator_keys() -> None:
    s = st.compute_status(mft(progress={"step": 3}), job(active=1), [pod()], now=NOW)
    assert set(s) <= set(st.OPERATOR_KEYS)


def compile_job(*c: tuple[str, str], total: int = 6, **status: Any) -> dict[str, Any]:
    j = job(*c, startTime="2025-12-31T23:59:00Z", **status)
    j["metadata"]["name"] = "r1-compile"
    j["spec"]["completions"] = total
    return j


def test_precompile_running_is_compiling_with_done_total_and_eta() -> None:
    s = st.compute_compile_status(mft(), compile_job(succeeded=2, active=4), [], now=NOW)
    assert s["phase"] == "Compiling"
    assert conds(s)["Queued"] == ("True", "Compiling")
    assert conds(s)["Running"] == ("False", "NotStarted")
    # 2 of 6 graphs in 60 s: 30 s a graph, 4 to go
    assert s["compile"] == {"done": 2, "total": 6, "etaSeconds": 120.0, "jobName": "r1-compile"}
    assert "2/6" in s["message"]
    assert "completionTime" not in s and "jobName" not in s


def test_precompile_before_the_first_graph_has_no_eta() -> None:
    s = st.compute_compile_status(mft(), compile_job(active=6), [], now=NOW)
    assert s["phase"] == "Compiling" and "etaSeconds" not in s["compile"]
    assert s["compile"]["done"] == 0


def test_precompile_complete_waits_for_the_training_job() -> None:
    s = st.compute_compile_status(mft(), compile_job(("Complete", ""), succeeded=6), [], now=NOW)
    assert s["phase"] == "Pending" and conds(s)["Queued"] == ("True", "Compiled")
    assert s["compile"]["done"] == 6 and s["compile"]["etaSeconds"] == 0.0


def test_failed_compile_fails_the_run_with_the_graph_and_compiler_message() -> None:
    p = pod(
        name="r1-compile-3-xyz",
        phase="Failed",
        state={
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "message": "compile of graph 3 attention failed: inductor: " + "x" * 9000,
            }
        },
    )
    j = compile_job(("FailureTarget", "PodFailurePolicy"), ("Failed", "PodFailurePolicy"))
    s = st.compute_compile_status(mft(), j, [p], now=NOW)
    assert s["phase"] == "Failed"
    assert conds(s)["Failed"] == ("True", "CompileFailed")
    assert (
        "r1-compile-3-xyz" in s["message"] and "compile of graph 3 attention failed" in s["message"]
    )
    assert len(s["message"]) <= st.MAX_MESSAGE
    assert s["completionTime"] == NOW
