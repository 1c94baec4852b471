"""loader.check_pin_dir: deploy pins only into directories no other user can change.
Plain directories stand in for bpffs here (the check looks at owners and modes only)."""

from __future__ import annotations

import os

import pytest

from controlplane.errors import LoaderError
from controlplane.loader import check_pin_dir


def layout(tmp_path, mode_top=0o1777):
    top = tmp_path / "bpf"  # like a bpffs root: shared, sticky
    top.mkdir()
    os.chmod(top, mode_top)
    pin_dir = top / "edge"
    return pin_dir, pin_dir / "v3" / "eth0-1"


def test_missing_directories_are_fine_deploy_makes_them(tmp_path):
    pin_dir, pin_path = layout(tmp_path)
    check_pin_dir(str(pin_dir), pin_path)
    pin_path.mkdir(parents=True)
    check_pin_dir(str(pin_dir), pin_path)


def test_a_writable_directory_anywhere_on_the_way_is_refused(tmp_path):
    pin_dir, pin_path = layout(tmp_path)
    pin_path.mkdir(parents=True)
    os.chmod(pin_path.parent, 0o777)
    with pytest.raises(
        LoaderError, match=r"^node\.pin_dir: .*/edge/v3 is writable by others \(mode 0777\); chmod go-w it$"
    ):
        check_pin_dir(str(pin_dir), pin_path)


def test_a_shared_parent_must_be_sticky(tmp_path):
    pin_dir, pin_path = layout(tmp_path, mode_top=0o777)
    with pytest.raises(LoaderError, match=r"/bpf is writable by others \(mode 0777\)"):
        check_pin_dir(str(pin_dir), pin_path)


def test_a_symlink_in_place_of_the_pin_dir_is_refused(tmp_path):
    pin_dir, pin_path = layout(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    pin_dir.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LoaderError, match=r"/edge is a symbolic link"):
        check_pin_dir(str(pin_dir), pin_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_directory_of_another_user_is_refused(tmp_path):
    pin_dir, pin_path = layout(tmp_path)
    pin_dir.mkdir()
    os.chown(pin_dir, 65534, -1)
    with pytest.raises(LoaderError, match=r"/edge is owned by uid 65534, not root"):
        check_pin_dir(str(pin_dir), pin_path)


def test_a_parent_made_by_another_instance_meanwhile_is_no_error(tmp_path, monkeypatch):
    """Two edgeds of one host deploying at once both found the ABI's directory missing; the
    second mkdir failed with FileExistsError (a fleet test's edged exited with that traceback)."""
    from pathlib import Path

    from controlplane.deploy import make_pin_path
    from controlplane.undo import Undo

    pin_dir, pin_path = layout(tmp_path)
    other = pin_dir / "v3" / "eth1-1"
    other.mkdir(parents=True)  # the other instance got there first...
    real_exists = Path.exists
    monkeypatch.setattr(
        Path, "exists", lambda p: False if p == pin_dir / "v3" else real_exists(p)
    )  # ...after we looked
    undo = Undo()
    make_pin_path(pin_path, undo)
    assert pin_path.is_dir()
    monkeypatch.undo()
    assert undo.rollback() == []  # the instance's directory goes; the shared ones stay, in use
    assert not pin_path.exists() and other.is_dir()


def test_undo_removes_the_parents_it_made_while_empty(tmp_path):
    from controlplane.deploy import make_pin_path
    from controlplane.undo import Undo

    pin_dir, pin_path = layout(tmp_path)
    undo = Undo()
    make_pin_path(pin_path, undo)
    (pin_path / "edge_vips").write_text("")  # a pin
    assert undo.rollback() == []
    assert not pin_dir.exists()
