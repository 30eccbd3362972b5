"""Whether another UID could change a cached tree between our check and the server's load (trust.py)."""

from __future__ import annotations

import os

from trtllm_entrypoint.storage import trust


def tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "file").write_text("x")
    trust.restrict_writes(root)
    return root


def test_a_tree_of_this_uid_writable_by_no_one_else_is_trusted(tmp_path):
    assert trust.untrusted(tree(tmp_path / "t")) is None


def test_group_write_another_owner_or_a_link_make_it_untrusted(tmp_path):
    root = tree(tmp_path / "t")
    os.chmod(root / "sub" / "file", 0o664)
    assert "writable by its group" in trust.untrusted(root)
    trust.restrict_writes(root)
    os.lchown(root / "sub", 1001, 1001)
    assert "belongs to UID 1001" in trust.untrusted(root)
    os.lchown(root / "sub", os.geteuid(), os.getegid())
    (root / "link").symlink_to(root / "sub")
    assert "symbolic link" in trust.untrusted(root)


def test_directories_where_another_uid_can_rename_are_named_unless_sticky(tmp_path):
    base = tmp_path / "cache"
    (base / "engines").mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    os.chmod(base, 0o775)  # group-writable, as fsGroup or the GID 0 pattern leave a volume
    assert trust.open_ancestors(base / "engines") == [base]
    os.chmod(base, 0o1775)
    assert trust.open_ancestors(base / "engines") == []
    os.chown(base, 1001, 1001)
    os.chmod(base, 0o755)  # another UID's: it may rename what is inside
    assert trust.open_ancestors(base / "engines") == [base]
