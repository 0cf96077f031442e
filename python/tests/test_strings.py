"""Strings the binding hands to the library: a NUL in a path, an option
value or a name, and text with no UTF-8 form (a lone surrogate such as
'\\udcff', what os.fsdecode makes of bytes that are not UTF-8) raise
ValueError naming what was wrong, in every entry point that takes a str;
never a silently cut path, never RuntimeError. A NUL inside data (a str
component's value, a str artifact) is data, and kept."""

import pathlib

import pytest

import kcache

SURROGATE = "\udcff"


def raises_value_error(fn, match):
    with pytest.raises(ValueError, match=match) as e:
        fn()
    assert not isinstance(e.value, RuntimeError)


@pytest.mark.parametrize("opt", ["dir", "remote_secret_file", "bundles", "bundle_trust", "log_file", "producer"])
def test_option_values(tmp_path, opt):
    good = str(tmp_path / "x")
    raises_value_error(lambda: kcache.Cache(**{opt: good + "\0tail"}, env=False), "NUL")
    raises_value_error(lambda: kcache.Cache(**{opt: good + SURROGATE}, env=False), "lone surrogate")


def test_dir_as_path_and_bytes(tmp_path):
    raises_value_error(lambda: kcache.Cache(pathlib.Path(str(tmp_path) + "/a\0b"), env=False), "NUL")
    raises_value_error(lambda: kcache.Cache(str(tmp_path).encode() + b"/a\0b", env=False), "NUL")
    raises_value_error(lambda: kcache.Cache(str(tmp_path).encode() + b"/\xff", env=False), "UTF-8")
    raises_value_error(lambda: kcache.Cache(bundles=[str(tmp_path / "a"), "b\0"], env=False), "NUL")
    # Nothing was created under the part before the NUL.
    assert not (tmp_path / "a").exists()


def test_key_strings():
    raises_value_error(lambda: kcache.key("ns\0x", a=1), "NUL")
    raises_value_error(lambda: kcache.key("ns" + SURROGATE, a=1), "lone surrogate")
    raises_value_error(lambda: kcache.key("ns", **{"a\0b": 1}), "NUL")
    raises_value_error(lambda: kcache.key("ns", **{"a" + SURROGATE: 1}), "lone surrogate")
    raises_value_error(lambda: kcache.key("ns", a="x" + SURROGATE), "lone surrogate")
    raises_value_error(lambda: kcache.key("ns", a={"k" + SURROGATE: 1}), "lone surrogate")
    raises_value_error(lambda: kcache.key("ns", a={"k": "v" + SURROGATE}), "lone surrogate")
    raises_value_error(lambda: kcache.key("ns", a=["v" + SURROGATE]), "lone surrogate")
    raises_value_error(lambda: kcache.key("ns", a=[{"k": SURROGATE}]), "lone surrogate")
    # A NUL in a value is part of the value.
    assert kcache.key("ns", a="x\0y") != kcache.key("ns", a="x")
    assert kcache.key("ns", a="x\0y") == kcache.key("ns", a="x\0y")


def test_artifact_strings(tmp_path):
    c = kcache.Cache(str(tmp_path / "kcache"), env=False)
    k = kcache.key("ns", a=1)
    raises_value_error(lambda: c.put(k, {"obj\0x": b"1"}), "NUL")
    raises_value_error(lambda: c.put(k, {"obj" + SURROGATE: b"1"}), "lone surrogate")
    raises_value_error(lambda: c.put(k, {"obj": "text" + SURROGATE}), "lone surrogate")
    raises_value_error(lambda: c.get_or_compile(k, lambda: {"obj" + SURROGATE: b"1"}), "lone surrogate")
    raises_value_error(lambda: c.get_or_compile(k, lambda: {"o\0bj": b"1"}), "NUL")
    with c.begin(k) as f:
        raises_value_error(lambda: f.commit({"o\0bj": b"1"}), "NUL")
        raises_value_error(lambda: f.commit({"obj": SURROGATE}), "lone surrogate")
        assert f.owner  # a refused argument leaves the caller the owner
        e = f.commit({"obj": "a\0b"})
    assert bytes(e["obj"]) == b"a\0b"
    raises_value_error(lambda: e[SURROGATE], "lone surrogate")
    raises_value_error(lambda: e.get(SURROGATE), "lone surrogate")
    assert SURROGATE not in e
    assert "obj" in e
    c.close()
