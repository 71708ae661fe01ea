"""A ``datasets.save_to_disk`` directory is read only from its own files (red-team pass, issue
38): ``datasets`` joins the names in ``state.json``/``dataset_dict.json`` to the directory, so a
planted ``../other/x.arrow``, an absolute name or a link would read another namespace's data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from npu_lora.data.base import DataError
from npu_lora.data.hf import _rows

datasets = pytest.importorskip("datasets")


def _save(path: Path, text: str) -> Path:
    datasets.Dataset.from_list([{"text": text}]).save_to_disk(str(path))
    return path


def _arrow(path: Path) -> str:
    return next(p.name for p in path.iterdir() if p.suffix == ".arrow")


@pytest.fixture
def dirs(tmp_path):
    secret = _save(tmp_path / "secret", "SECRET")
    mine = _save(tmp_path / "data" / "mine", "mine")
    return secret, mine


def _set_files(mine: Path, names: list[str]) -> None:
    st = json.loads((mine / "state.json").read_text())
    st["_data_files"] = [{"filename": n} for n in names]
    (mine / "state.json").write_text(json.dumps(st))


@pytest.mark.parametrize("how", ["dotdot", "absolute", "nested", "not-a-list"])
def test_data_files_outside_the_directory_are_refused(dirs, how):
    secret, mine = dirs
    name = {
        "dotdot": f"../../secret/{_arrow(secret)}",
        "absolute": str(secret / _arrow(secret)),
        "nested": f"x/../{_arrow(mine)}",
    }.get(how)
    if name is None:
        st = json.loads((mine / "state.json").read_text())
        st["_data_files"] = "x"
        (mine / "state.json").write_text(json.dumps(st))
    else:
        _set_files(mine, [name])
    with pytest.raises(DataError, match=r"state\.json: _data_files must be plain names"):
        _rows(mine)


def test_a_linked_data_file_is_refused(dirs):
    secret, mine = dirs
    (mine / "link.arrow").symlink_to(secret / _arrow(secret))
    _set_files(mine, ["link.arrow"])
    with pytest.raises(DataError, match=r"link\.arrow: a data file must be a regular file"):
        _rows(mine)


def test_dataset_dict_splits_outside_the_directory_are_refused(tmp_path):
    secret = _save(tmp_path / "secret", "SECRET")
    dd = tmp_path / "data" / "dd"
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{"text": "mine"}])}).save_to_disk(
        str(dd)
    )
    assert [r["text"] for r in _rows(dd)] == ["mine"]
    (dd / "dataset_dict.json").write_text(json.dumps({"splits": ["../../secret"]}))
    with pytest.raises(DataError, match=r"splits must be plain names"):
        _rows(dd)
    (dd / "evil").symlink_to(secret)
    (dd / "dataset_dict.json").write_text(json.dumps({"splits": ["evil"]}))
    with pytest.raises(DataError, match=r"evil: a split must be a directory"):
        _rows(dd)


def test_a_plain_saved_directory_still_reads(dirs):
    _, mine = dirs
    assert [r["text"] for r in _rows(mine)] == ["mine"]
