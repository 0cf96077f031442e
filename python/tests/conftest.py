"""Fixtures of the kcache Python suite: cache folders, a real redis-server on
a free loopback port, and Triton subprocesses that count their ptxas runs."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def cache_dir(tmp_path):
    return str(tmp_path / "kcache")


@pytest.fixture(autouse=True)
def _no_kcache_env(monkeypatch):
    # Tests set what they need; the caller's KCACHE_* settings must not leak in.
    for k in list(os.environ):
        if k.startswith("KCACHE_") or k.startswith("TRITON_"):
            monkeypatch.delenv(k, raising=False)


# ---- Redis -------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A redis-server started for one test, and a minimal RESP client."""

    def __init__(self, workdir):
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.skip("redis-server is not installed (scripts/install-deps.sh installs it)")
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while True:
            try:
                if self.command("PING") == "PONG":
                    break
            except OSError:
                pass
            if time.time() > deadline:
                self.close()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}"

    def command(self, *args):
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            out = b"*%d\r\n" % len(args)
            for a in args:
                a = a if isinstance(a, bytes) else str(a).encode()
                out += b"$%d\r\n%s\r\n" % (len(a), a)
            s.sendall(out)
            f = s.makefile("rb")
            return self._read(f)

    def _read(self, f):
        line = f.readline().rstrip(b"\r\n")
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = f.read(n + 2)[:-2]
            return data
        if t == b"*":
            return [self._read(f) for _ in range(int(rest))]
        raise RuntimeError(f"bad reply {line!r}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def redis(tmp_path):
    r = Redis(tmp_path)
    yield r
    r.close()


# ---- Triton subprocesses -------------------------------------------------------

def triton_available():
    try:
        import triton  # noqa: F401
        return True
    except ImportError:
        return False


class TritonEnv:
    """Environment for Triton subprocesses that compile the test kernels for
    sm_90 without a GPU, counting ptxas runs through a wrapper script."""

    def __init__(self, tmp_path):
        import triton
        real = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
        self.count_file = str(tmp_path / "ptxas-runs")
        self.wrapper = str(tmp_path / "ptxas-wrapper")
        with open(self.wrapper, "w") as f:
            f.write("#!/bin/sh\n"
                    "# Counts compiles (not --version probes), then runs the real ptxas.\n"
                    "case \"$1\" in --version) ;; *) echo \"$$\" >> \"$PTXAS_COUNT_FILE\"\n"
                    "  if [ -n \"$PTXAS_SLEEP\" ]; then sleep \"$PTXAS_SLEEP\"; fi ;; esac\n"
                    f"exec {real} \"$@\"\n")
        os.chmod(self.wrapper, 0o755)
        self.tmp = tmp_path
        self.base = {
            "TRITON_PTXAS_PATH": self.wrapper,
            "TRITON_PTXAS_BLACKWELL_PATH": self.wrapper,
            "PTXAS_COUNT_FILE": self.count_file,
            "TRITON_DEFAULT_FP_FUSION": "1",
            "TRITON_CACHE_DIR": str(tmp_path / "triton-cache"),
            "TRITON_HOME": str(tmp_path / "home"),
            "PYTHONWARNINGS": "ignore",
        }

    def ptxas_runs(self):
        try:
            with open(self.count_file) as f:
                return len(f.read().split())
        except FileNotFoundError:
            return 0

    def env(self, manager="kcache", **extra):
        e = {k: v for k, v in os.environ.items() if not k.startswith(("KCACHE_", "TRITON_"))}
        e.update(self.base)
        if manager == "kcache":
            e["TRITON_CACHE_MANAGER"] = "kcache.triton:CacheManager"
        elif manager == "remote":
            e["TRITON_CACHE_MANAGER"] = "triton.runtime.cache:RemoteCacheManager"
            e["TRITON_REMOTE_CACHE_BACKEND"] = "kcache.triton:RemoteBackend"
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def start(self, n=None, manager="kcache", **extra):
        args = [sys.executable, os.path.join(HERE, "triton_worker.py")]
        if n is not None:
            args.append(str(n))
        return subprocess.Popen(args, env=self.env(manager, **extra), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    @staticmethod
    def result(proc, timeout=240):
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err[-4000:]}"
        return json.loads(out.strip().splitlines()[-1])

    def run(self, n=None, manager="kcache", **extra):
        return self.result(self.start(n, manager, **extra))


@pytest.fixture
def triton_env(tmp_path):
    if not triton_available():
        pytest.skip("Triton is not installed in this Python (make python installs it into build/venv)")
    return TritonEnv(tmp_path)
