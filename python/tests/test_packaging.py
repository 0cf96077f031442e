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

# name -> (pkg-config modules left out, extra CMake definitions)
CASES = {
    **{m: ([m], []) for m in MODULES},
    "openssl": ([], ["-DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON"]),
    "reduced": (["lmdb"], ["-DKCACHE_PYTHON_REDUCED=ON"]),
}


def _pc_file(module):
    out = subprocess.run(["pkg-config", "--variable=pcfiledir", module], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"pkg-config does not find {module} here")
    return os.path.join(out.stdout.strip(), module + ".pc")


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    """Every case configured at once (each is a CMake run of a few seconds):
    name -> (exit status, output on one line)."""
    if not shutil.which("cmake") or not shutil.which("pkg-config"):
        pytest.skip("cmake and pkg-config are needed")
    procs = {}
    for name, (without, defines) in CASES.items():
        tmp = tmp_path_factory.mktemp(name)
        # A pkg-config folder holding every module but `without`: to CMake,
        # as on a machine where those packages are not installed.
        pc = tmp / "pkgconfig"
        pc.mkdir()
        for m in MODULES:
            if m not in without:
                shutil.copy(_pc_file(m), pc / (m + ".pc"))
        env = dict(os.environ, PKG_CONFIG_LIBDIR=str(pc), PKG_CONFIG_PATH="")
        args = ["cmake", "-S", ROOT, "-B", str(tmp / "build"), "-DKCACHE_BUILD_PYTHON=ON",
                f"-DPython_EXECUTABLE={sys.executable}", "-DKCACHE_WITH_LLVM=OFF", "-DKCACHE_WITH_NVRTC=OFF",
                "-DKCACHE_WITH_OPENCL=OFF", "-DKCACHE_BUILD_TESTS=OFF", "-DKCACHE_BUILD_BENCH=OFF",
                "-DKCACHE_BUILD_EXAMPLES=OFF", *defines]
        procs[name] = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out = {}
    for name, p in procs.items():
        text, _ = p.communicate(timeout=300)
        out[name] = (p.returncode, " ".join(text.split()))
    return out


@pytest.mark.parametrize("module", list(MODULES))
def test_missing_library_names_its_debian_package(configured, module):
    rc, out = configured[module]
    assert rc != 0, out
    assert f"install {MODULES[module]}" in out, out


def test_missing_openssl_names_libssl_dev(configured):
    rc, out = configured["openssl"]
    assert rc != 0 and "install libssl-dev" in out, out


def test_reduced_python_build_is_an_explicit_choice(configured):
    rc, out = configured["reduced"]
    assert "Debian package liblmdb-dev" in out and "kcache features: LMDB=OFF" in out, out
