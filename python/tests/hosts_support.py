"""Running host worker scripts (numba_worker.py, jax_worker.py,
warp_worker.py) as real processes, counting the host's own compiles
through a file each worker appends to, and damaging stored entries."""

import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class HostEnv:
    def __init__(self, tmp_path, worker, **base):
        self.tmp = tmp_path
        self.worker = os.path.join(HERE, worker)
        self.count_file = str(tmp_path / "compiles")
        self.kcache_dir = str(tmp_path / "kcache")
        self.base = {"COUNT_FILE": self.count_file, "KCACHE_DIR": self.kcache_dir, "PYTHONWARNINGS": "ignore"}
        self.base.update({k: str(v) for k, v in base.items()})

    def compiles(self):
        """The host's own compiles so far, in every process."""
        try:
            with open(self.count_file) as f:
                return len(f.read().split())
        except FileNotFoundError:
            return 0

    def env(self, **extra):
        e = {k: v for k, v in os.environ.items() if not k.startswith("KCACHE_")}
        e.update(self.base)
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def start(self, *args, **extra):
        return subprocess.Popen([sys.executable, self.worker, *map(str, args)], env=self.env(**extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)

    @staticmethod
    def result(proc, timeout=240):
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"worker failed ({proc.returncode}):\n{err[-4000:]}"
        return json.loads(out.strip().splitlines()[-1])

    def run(self, *args, **extra):
        return self.result(self.start(*args, **extra))


def tier(stats, name):
    return [t["stats"] for t in stats["tiers"] if t["name"] == name or t["kind"] == name][0]


def damage_files_engine_entries(kcache_dir):
    """Flips one byte in the middle of every entry of a files-engine store;
    returns how many."""
    store = os.path.join(kcache_dir, "files")
    entries = [p for p in glob.glob(os.path.join(store, "**", "*"), recursive=True)
               if os.path.isfile(p) and len(os.path.basename(p)) >= 32 and os.path.basename(p)[:32].isalnum()]
    for p in entries:
        with open(p, "r+b") as f:
            f.seek(os.path.getsize(p) // 2)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0xFF]))
    return len(entries)


def poison_redis_values(redis):
    """Flips the last byte of every kcache value in Redis (the MAC then
    fails); returns the keys. Values only: kcache:{32 hex digits}, not
    leases nor the statistics hash."""
    keys = redis.command("KEYS", "kcache:{" + "?" * 32 + "}")
    for k in keys:
        try:
            v = redis.command("GET", k)
        except RuntimeError:  # not a value (a lease, a list)
            continue
        if not isinstance(v, bytes) or not v:
            continue
        v = bytearray(v)
        v[-1] ^= 0x01
        assert redis.command("SET", k, bytes(v)) == "OK"
    return keys
