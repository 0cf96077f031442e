"""The KCACHE_* variables every host honours, as each host really runs
(numba, JAX, Warp and Triton workers in real processes): KCACHE_DISABLE compiles
everything and leaves the store as it was, KCACHE_RECOMPILE compiles
everything and replaces the entries (a later process hits them),
KCACHE_READONLY compiles what is missing and stores nothing; none of them
changes a result or fails a compile."""

import shutil

import pytest

from hosts_support import HostEnv

N = 2

HOSTS = {
    "numba": dict(worker="numba_worker.py", module="numba", env={}),
    "jax": dict(worker="jax_worker.py", module="jax", env={"JAX_PLATFORMS": "cpu"}),
    "warp": dict(worker="warp_worker.py", module="warp", env={"WARP_KERNEL_CACHE": "{tmp}/warp"}),
}


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_disable_recompile_and_read_only_from_the_environment(host, tmp_path):
    spec = HOSTS[host]
    pytest.importorskip(spec["module"], reason=f"{host} is not installed (make python installs it)")
    env = HostEnv(tmp_path, spec["worker"], **{k: v.format(tmp=tmp_path) for k, v in spec["env"].items()})

    def run(**extra):
        # The host's own folder (Warp's kernel cache) emptied: what is not
        # built comes from kcache.
        shutil.rmtree(tmp_path / "warp", ignore_errors=True)
        return env.run(N, **extra)

    cold = run()
    programs = cold["compiles"]  # JAX compiles helper programs too
    assert programs >= N
    disabled = run(KCACHE_DISABLE="1")
    assert disabled["compiles"] == programs and disabled["results"] == cold["results"]
    assert run()["compiles"] == 0  # the store as the cold run left it
    again = run(KCACHE_RECOMPILE="1")
    assert again["compiles"] == programs and again["results"] == cold["results"]
    warm = run()
    assert warm["compiles"] == 0 and warm["results"] == cold["results"]
    # Read-only on an empty store: compiled, nothing stored.
    empty = tmp_path / "empty"
    ro = run(KCACHE_DIR=empty, KCACHE_READONLY="1")
    assert ro["compiles"] == programs and ro["results"] == cold["results"]
    assert run(KCACHE_DIR=empty)["compiles"] == programs


def test_triton_honours_the_same_variables(triton_env, tmp_path):
    cold = triton_env.run(N)
    assert triton_env.ptxas_runs() == N
    disabled = triton_env.run(N, KCACHE_DISABLE="1")
    assert triton_env.ptxas_runs() == 2 * N and disabled["cubins"] == cold["cubins"]
    assert triton_env.run(N)["cubins"] == cold["cubins"] and triton_env.ptxas_runs() == 2 * N
    again = triton_env.run(N, KCACHE_RECOMPILE="1")
    assert triton_env.ptxas_runs() == 3 * N and again["cubins"] == cold["cubins"]
    assert triton_env.run(N)["cubins"] == cold["cubins"] and triton_env.ptxas_runs() == 3 * N
    empty = tmp_path / "empty"
    assert triton_env.run(N, KCACHE_DIR=empty, KCACHE_READONLY="1")["cubins"] == cold["cubins"]
    assert triton_env.ptxas_runs() == 4 * N
    triton_env.run(N, KCACHE_DIR=empty)
    assert triton_env.ptxas_runs() == 5 * N  # the read-only run stored nothing
