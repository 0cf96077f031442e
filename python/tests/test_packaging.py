"""Building the package: a core library that is missing stops the Python
build (CMake, as `pip install .` runs it) with the Debian package to
install, instead of building a package without it; KCACHE_PYTHON_REDUCED
asks for the reduced package on purpose."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pkg-config module -> Debian package.
MODULES = {"libxxhash": "libxxhash-dev", "lmdb": "liblmdb-dev", "libzstd": "libzstd-dev", "hiredis": "libhiredis-dev"}


def _pc_file(module):
    out = subprocess.run(["pkg-config", "--variable=pcfiledir", module], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"pkg-config does not find {module} here")
    return os.path.join(out.stdout.strip(), module + ".pc")


@pytest.fixture(scope="module")
def tools():
    if not shutil.which("cmake") or not shutil.which("pkg-config"):
        pytest.skip("cmake and pkg-config are needed")


def _configure(tmp_path, without=(), defines=()):
    # A pkg-config folder holding every module but `without`: to CMake, as
    # on a machine where those packages are not installed.
    pc = tmp_path / "pkgconfig"
    pc.mkdir()
    for m in MODULES:
        if m not in without:
            shutil.copy(_pc_file(m), pc / (m + ".pc"))
    env = dict(os.environ, PKG_CONFIG_LIBDIR=str(pc), PKG_CONFIG_PATH="")
    args = ["cmake", "-S", ROOT, "-B", str(tmp_path / "build"), "-DKCACHE_BUILD_PYTHON=ON",
            f"-DPython_EXECUTABLE={sys.executable}", "-DKCACHE_WITH_LLVM=OFF", "-DKCACHE_WITH_NVRTC=OFF",
            "-DKCACHE_WITH_OPENCL=OFF", "-DKCACHE_BUILD_TESTS=OFF", "-DKCACHE_BUILD_BENCH=OFF",
            "-DKCACHE_BUILD_EXAMPLES=OFF", *defines]
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    return r.returncode, " ".join((r.stdout + r.stderr).split())


@pytest.mark.parametrize("module", list(MODULES))
def test_missing_library_names_its_debian_package(tools, tmp_path, module):
    rc, out = _configure(tmp_path, without=[module])
    assert rc != 0, out
    assert f"install {MODULES[module]}" in out, out


def test_missing_openssl_names_libssl_dev(tools, tmp_path):
    rc, out = _configure(tmp_path, defines=["-DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON"])
    assert rc != 0 and "install libssl-dev" in out, out


def test_reduced_python_build_is_an_explicit_choice(tools, tmp_path):
    rc, out = _configure(tmp_path, without=["lmdb"], defines=["-DKCACHE_PYTHON_REDUCED=ON"])
    assert "Debian package liblmdb-dev" in out and "kcache features: LMDB=OFF" in out, out
