"""Config files reach Python through the one options pipeline: a setting
kept in the store folder's config (as `kcache config set` writes it) or in
the user-wide one applies to kcache.Cache as it does to the library and
the tool; the program's keyword arguments come before them and the
KCACHE_* variables after."""
import kcache


def _key(i):
    return kcache.key("pyconfig/1", i=i)


def test_the_store_folders_config_applies(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("KCACHE_READONLY", raising=False)
    monkeypatch.delenv("KCACHE_DIR", raising=False)
    folder = tmp_path / "cache"
    with kcache.Cache(str(folder)) as c:
        assert c.put(_key(1), {"obj": b"x"}) is not None
    # read_only kept in the store folder's config: nothing is stored.
    (folder / "config").write_text("# kept by kcache config set\nread_only = 1\n")
    with kcache.Cache(str(folder)) as c:
        assert c.put(_key(2), {"obj": b"y"}) is None
        assert c.get(_key(1)) is not None
    # The environment comes after the file.
    monkeypatch.setenv("KCACHE_READONLY", "0")
    with kcache.Cache(str(folder)) as c:
        assert c.put(_key(3), {"obj": b"z"}) is not None


def test_the_user_wide_config_applies(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("KCACHE_DISABLE", raising=False)
    monkeypatch.delenv("KCACHE_DIR", raising=False)
    (tmp_path / "xdg" / "kcache").mkdir(parents=True)
    (tmp_path / "xdg" / "kcache" / "config").write_text("disabled = 1\n")
    runs = []

    def compile():
        runs.append(1)
        return {"obj": b"x"}

    with kcache.Cache(str(tmp_path / "cache")) as c:
        c.get_or_compile(_key(1), compile)
        c.get_or_compile(_key(1), compile)
    assert len(runs) == 2  # disabled: every request compiles
