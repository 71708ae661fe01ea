"""Run identity: a run directory and its checkpoints belong to one run.

The identity of a run is ``(namespace, name, uid)``: in a cluster the MoEFinetune's namespace and
UID come from the operator (``NPU_LORA_RESOURCE_NAMESPACE``, ``NPU_LORA_RESOURCE_UID``), else
from the manifest's ``metadata``; a local run has no UID and gets a generated ``runId``. The
first write of a run directory records it in ``run.json`` (and every checkpoint's
``state.json`` carries a copy, ``"run"``).

Decision, made before anything is written (:func:`plan_run`):

- the directory is new, or belongs to this run (same UID; for local runs same namespace and
  name): resume as usual (a pod retried by its Job, a rerun of the same command);
- it belongs to a run with the *same namespace and name* but another UID: the old object was
  deleted (a namespace holds one object of a name at a time) and this is its re-creation. It
  starts fresh: the old directory is renamed to ``<dir>.prev-<old uid>`` (kept, never
  overwritten). With ``spec.resumeFrom`` naming this directory it adopts the old checkpoint;
- it belongs to another run (another namespace or name): refused (exit 2) naming both runs.
  ``spec.resumeFrom`` may name such a directory only as a *source*: its checkpoint (and the
  metrics up to it) are copied into this run's own directory; the source is only read.

``spec.resumeFrom`` (:func:`resolve_resume_from`) stays inside the run's own storage: a relative
path (no absolute path, no ``~``, no ``..``) below the output root (the output volume's mount
when the run directory is on it, else the run directory's parent), walked one component at a
time with ``openat(O_NOFOLLOW | O_DIRECTORY)`` from the root, so no symbolic link is followed;
the source must hold a ``run.json`` of a run of the *same namespace*, and its checkpoint only
regular files.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from npu_lora.api.load import SpecError
from npu_lora.api.timefmt import rfc3339
from npu_lora.api.v1alpha1 import ENV_NAMESPACE, ENV_UID
from npu_lora.api.volumes import volume_root
from npu_lora.train.checkpoint import NAME as CHECKPOINT
from npu_lora.train.checkpoint import find_checkpoint, fsync_dir

if TYPE_CHECKING:
    from npu_lora.api.v1alpha1 import MoEFinetune
    from npu_lora.train.rundir import ResumePlan

RUN_FILE = "run.json"
_RUN_FILES = ("config.yaml", "metrics.jsonl", CHECKPOINT, "adapter", "summary.json", RUN_FILE)


@dataclass(frozen=True)
class RunIdentity:
    name: str | None
    namespace: str | None
    uid: str | None  # the MoEFinetune's UID; None for a local run
    run_id: str  # the UID, or a generated id for a local run

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
            "runId": self.run_id,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunIdentity:
        def s(key: str) -> str | None:
            v = d.get(key)
            return str(v) if v not in (None, "") else None

        uid = s("uid")
        return cls(s("name"), s("namespace"), uid, s("runId") or uid or "")

    def describe(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else f"{self.name}"
        return f"{where} (uid {self.uid})" if self.uid else f"{where} (local run {self.run_id})"

    def same_run(self, other: RunIdentity) -> bool:
        if self.uid or other.uid:
            return self.uid == other.uid
        return (self.name, self.namespace) == (other.name, other.namespace)


def current_identity(manifest: MoEFinetune) -> RunIdentity:
    """This process's run: the operator's environment, else the manifest's metadata."""
    meta = manifest.metadata
    extra = meta.model_extra or {}
    uid = os.environ.get(ENV_UID) or extra.get("uid") or None
    namespace = os.environ.get(ENV_NAMESPACE) or meta.namespace
    run_id = str(uid) if uid else f"local-{uuid.uuid4().hex[:12]}"
    return RunIdentity(meta.name, namespace, str(uid) if uid else None, run_id)


def has_run_files(run_dir: Path) -> bool:
    return run_dir.is_dir() and any((run_dir / n).exists() for n in _RUN_FILES)


def saved_identity(run_dir: Path) -> RunIdentity | None:
    """Who wrote ``run_dir``: run.json, else its checkpoint's, else config.yaml's metadata."""
    try:
        d = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
        if isinstance(d, dict):
            return RunIdentity.from_dict(d)
    except (OSError, ValueError):
        pass
    found = find_checkpoint(run_dir) if run_dir.is_dir() else None
    if found is not None and isinstance(found[1].get("run"), dict):
        return RunIdentity.from_dict(found[1]["run"])
    try:  # a directory written before run.json existed
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        meta = cfg.get("metadata") or {}
        return RunIdentity(meta.get("name"), meta.get("namespace"), meta.get("uid"), "legacy")
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return None


@dataclass
class RunPlan:
    """What to do with the run directory, decided before anything is written."""

    identity: RunIdentity
    resume: ResumePlan
    move_aside: Path | None = None  # rename the re-created run's old directory to this
    copy_from: Path | None = None  # copy this checkpoint (resumeFrom) into the run directory
    notes: list[str] = field(default_factory=list)


def output_root(run_dir: Path) -> Path:
    """What ``spec.resumeFrom`` is relative to: the output volume's mount (``NPU_LORA_OUTPUT_ROOT``,
    default ``/mnt/output``) when ``run_dir`` lies below it, else ``run_dir``'s parent."""
    vol = volume_root("output")
    try:
        rd, vr = run_dir.resolve(), vol.resolve()
    except OSError:
        return run_dir.parent
    return vr if vr in rd.parents else run_dir.parent


def _walk_beneath(root: Path, parts: list[str], value: str) -> None:
    """Open each component of ``parts`` below ``root`` with ``openat(O_NOFOLLOW|O_DIRECTORY)``:
    SpecError when one is a symbolic link or not a directory. A missing component ends the walk
    (the caller reports the missing directory)."""
    import errno

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise SpecError(f"spec.resumeFrom: the output root {root}: {e.strerror}") from None
    try:
        for i, part in enumerate(parts):
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                return
            except OSError as e:
                here = "/".join(parts[: i + 1])
                if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    link = os.path.islink(root.joinpath(*parts[: i + 1]))
                    what = "a symbolic link" if link else "not a directory"
                    raise SpecError(
                        f"spec.resumeFrom: {here!r} (of {value[:64]!r}) is {what} below the output "
                        f"root {root}; resumeFrom never follows links (it must stay in the run's "
                        "own storage)"
                    ) from None
                raise SpecError(f"spec.resumeFrom: {here!r}: {e.strerror}") from None
            os.close(fd)
            fd = nfd
    finally:
        os.close(fd)


def resolve_resume_from(value: str, run_dir: Path) -> Path:
    """``spec.resumeFrom`` as a path below :func:`output_root` (SpecError naming what is wrong:
    absolute, ``~``, ``..``, the root itself, a symbolic link or a file on the way)."""
    shown = repr(value[:64])
    if "\x00" in value:
        raise SpecError(f"spec.resumeFrom: {shown} contains a NUL byte; not a path")
    if value.startswith(("/", "~")):
        raise SpecError(
            f"spec.resumeFrom: {shown} is absolute; it is relative to the output root (the "
            "output volume in a cluster, the run directory's parent locally), e.g. the other "
            "run's output.path"
        )
    raw = value.split("/")
    if ".." in raw:
        raise SpecError(f"spec.resumeFrom: {shown} contains '..'; it may not leave the output root")
    parts = [p for p in raw if p not in ("", ".")]
    if not parts:
        raise SpecError(f"spec.resumeFrom: {shown} names the output root, not a run directory")
    root = output_root(run_dir)
    _walk_beneath(root, parts, value)
    return root.joinpath(*parts)


def _check_source(source: Path, cur: RunIdentity) -> None:
    """The resumeFrom source holds a ``run.json`` of a run of ``cur``'s namespace, and its
    checkpoint and metrics are regular files (no links out of it)."""
    try:
        d = json.loads((source / RUN_FILE).read_text(encoding="utf-8"))
        other = RunIdentity.from_dict(d) if isinstance(d, dict) else None
    except (OSError, ValueError):
        other = None
    if other is None:
        raise SpecError(
            f"spec.resumeFrom: {source} has no readable {RUN_FILE} (the identity of the run that "
            "wrote it): not read"
        )
    if other.namespace != cur.namespace:
        raise SpecError(
            f"spec.resumeFrom: {source} belongs to {other.describe()}, of another namespace "
            f"than this run ({cur.namespace}); a run starts only from a run of its own namespace"
        )
    for p in (source / RUN_FILE, source / "metrics.jsonl"):
        if p.is_symlink():
            raise SpecError(f"spec.resumeFrom: {p} is a symbolic link: not read")


def _check_checkpoint_files(ckpt: Path) -> None:
    import stat

    if not stat.S_ISDIR(os.lstat(ckpt).st_mode):  # a link to another run's checkpoint
        raise SpecError(
            f"spec.resumeFrom: {ckpt} is not a directory of its own (a symbolic link?): not read; "
            "resumeFrom never follows links"
        )
    for e in os.scandir(ckpt):
        if not stat.S_ISREG(e.stat(follow_symlinks=False).st_mode):
            raise SpecError(
                f"spec.resumeFrom: {ckpt / e.name} is not a regular file (a link?): not read"
            )


def _aside(run_dir: Path, old: RunIdentity) -> Path:
    tag = (old.uid or old.run_id or "old")[:8]
    cand = run_dir.with_name(f"{run_dir.name}.prev-{tag}")
    n = 1
    while cand.exists():
        n += 1
        cand = run_dir.with_name(f"{run_dir.name}.prev-{tag}-{n}")
    return cand


#: how deep and how wide :func:`check_own_directory` looks below a run directory for another
#: run's ``run.json``
CHILD_SCAN_DEPTH = 4
CHILD_SCAN_ENTRIES = 20_000


def check_own_directory(run_dir: Path, cur: RunIdentity | None = None) -> None:
    """``run_dir`` is a directory of its own: not a filesystem or volume root (a mount point),
    not inside another run's directory (a parent holds a ``run.json`` of another run), not
    above one (a child holds a ``run.json``). Raises SpecError naming the other run."""
    try:
        path = run_dir.resolve()
    except OSError as e:
        raise SpecError(f"--out: cannot resolve {run_dir}: {e.strerror}") from None
    if path == path.parent or (path.is_dir() and os.path.ismount(path)):
        raise SpecError(
            f"--out: {run_dir} is a filesystem or volume root; a run needs a directory of its "
            "own (set spec.output.path to a sub-directory, e.g. the run's name)"
        )
    for parent in path.parents:
        marker = parent / RUN_FILE
        if marker.is_file():
            other = saved_identity(parent)
            who = other.describe() if other else "another run"
            raise SpecError(
                f"--out: {run_dir} is inside the run directory {parent} of {who}; a run "
                "never writes into another run's directory"
            )
    if not path.is_dir():
        return
    seen = 0
    stack: list[tuple[Path, int]] = [(path, 0)]
    while stack:
        d, depth = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            seen += 1
            if seen > CHILD_SCAN_ENTRIES:
                return  # a huge tree: not a run directory's shape; the parent check still holds
            if depth > 0 and e.name == RUN_FILE and e.is_file(follow_symlinks=False):
                other = saved_identity(Path(d))
                if cur is not None and other is not None and other.same_run(cur):
                    continue
                who = other.describe() if other else "another run"
                raise SpecError(
                    f"--out: {run_dir} contains the run directory {d} of {who}; a run never "
                    "takes a directory above another run's"
                )
            if depth < CHILD_SCAN_DEPTH and e.is_dir(follow_symlinks=False):
                stack.append((Path(e.path), depth + 1))


def plan_run(run_dir: Path, manifest: MoEFinetune) -> RunPlan:
    """Check ``run_dir`` against this run's identity (and ``spec.resumeFrom``). Writes nothing."""
    from npu_lora.train.rundir import ResumePlan, plan_resume

    cur = current_identity(manifest)
    check_own_directory(run_dir, cur)
    resume_from = manifest.spec.resume_from
    source = resolve_resume_from(resume_from, run_dir) if resume_from else None
    is_self = source is not None and _same_path(source, run_dir)
    saved = saved_identity(run_dir) if has_run_files(run_dir) else None

    if saved is None or saved.same_run(cur):
        if saved is not None and not cur.uid and saved.run_id not in ("", "legacy"):
            cur = RunIdentity(cur.name, cur.namespace, None, saved.run_id)  # keep the local id
        plan = RunPlan(cur, plan_resume(run_dir, manifest))
        if plan.resume.checkpoint is None and source is not None and not is_self:
            _plan_copy(plan, source, manifest, run_dir, cur)
        return plan

    if saved.namespace == cur.namespace and saved.name == cur.name:
        if is_self:  # re-created and asked to continue the old run's directory
            plan = RunPlan(cur, plan_resume(run_dir, manifest))
            plan.notes.append(f"adopting {run_dir} of the deleted run {saved.describe()}")
            return plan
        plan = RunPlan(cur, ResumePlan(exists=False), move_aside=_aside(run_dir, saved))
        plan.notes.append(
            f"{run_dir} belongs to the deleted run {saved.describe()}: starting fresh; its files "
            f"move to {plan.move_aside} (set spec.resumeFrom: {run_dir.name} to continue it)"
        )
        if source is not None:
            _plan_copy(plan, source, manifest, run_dir, cur)
        return plan

    raise SpecError(
        f"--out: {run_dir} belongs to run {saved.describe()}, not to this run "
        f"{cur.describe()}; a run never resumes or overwrites another run's files. Use another "
        "directory (spec.output.path or --out); to start from that run's checkpoint set "
        "spec.resumeFrom to it and a directory of your own."
    )


def _same_path(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _plan_copy(
    plan: RunPlan, source: Path, manifest: MoEFinetune, run_dir: Path, cur: RunIdentity
) -> None:
    from npu_lora.train.rundir import plan_resume

    if not source.is_dir():
        raise SpecError(f"spec.resumeFrom: no such run directory: {source}")
    _check_source(source, cur)
    src = plan_resume(source, manifest)  # its config must match ours; read only
    if src.checkpoint is None:
        raise SpecError(f"spec.resumeFrom: {source} has no complete checkpoint")
    _check_checkpoint_files(src.checkpoint)
    plan.copy_from = src.checkpoint
    plan.resume.checkpoint = run_dir / CHECKPOINT
    plan.resume.checkpoint_step = src.checkpoint_step
    plan.notes.append(f"starting from the checkpoint of {source} at step {src.checkpoint_step}")


def apply_plan(plan: RunPlan, run_dir: Path) -> None:
    """Carry out the plan's writes: move aside, copy the resumeFrom checkpoint, run.json."""
    if plan.move_aside is None:
        _check_not_locked(run_dir)
    if plan.move_aside is not None:
        # only this run's own directory moves: a sibling name in the same parent, never a root
        # or a directory holding other runs (check_own_directory ran in plan_run)
        own = (run_dir / RUN_FILE).exists() or saved_identity(run_dir) is not None
        if plan.move_aside.parent != run_dir.parent or not own:
            raise SpecError(f"--out: refusing to move {run_dir} aside")
        with _old_run_stopped(run_dir):
            os.replace(run_dir, plan.move_aside)
        fsync_dir(run_dir.parent)
    run_dir.mkdir(parents=True, exist_ok=True)
    if plan.copy_from is not None:
        tmp = run_dir / f"{CHECKPOINT}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(plan.copy_from, tmp, symlinks=True)  # a link is never followed
            metrics = plan.copy_from.parent / "metrics.jsonl"
            if metrics.is_file() and not (run_dir / "metrics.jsonl").exists():
                shutil.copyfile(metrics, run_dir / "metrics.jsonl")
            os.replace(tmp, run_dir / CHECKPOINT)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    write_identity(run_dir, plan.identity)


def _check_not_locked(run_dir: Path) -> None:
    """Refuse (before writing) when another process holds the run directory's lock."""
    import fcntl

    lock = run_dir / ".lock"
    if not lock.is_file():
        return
    with open(lock, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpecError(
                f"--out: {run_dir} is in use by another npu-lora run (lock {lock})"
            ) from None
        except OSError:
            pass


@contextlib.contextmanager
def _old_run_stopped(run_dir: Path, timeout: float = 120.0):
    """Hold the old run's lock (its pod may still be stopping after the deletion)."""
    import fcntl

    with open(run_dir / ".lock", "a+") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{run_dir} is still in use by the deleted run's process after "
                        f"{timeout:.0f}s; retry when it has stopped"
                    ) from None
                time.sleep(0.5)
            except OSError:  # no flock on this filesystem
                break
        yield


def write_identity(run_dir: Path, ident: RunIdentity) -> None:
    from npu_lora.train.rundir import write_text_atomic

    doc = {**ident.to_dict(), "recorded": rfc3339()}
    write_text_atomic(run_dir / RUN_FILE, json.dumps(doc, indent=1) + "\n")
