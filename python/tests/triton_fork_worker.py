"""Compiles the first N test kernels (sm_90, no GPU needed) in N forked
workers of a ProcessPoolExecutor, one kernel each, under the
TRITON_CACHE_MANAGER the environment names, then exits."""

import concurrent.futures
import hashlib
import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton_kernels  # noqa: E402


def compile_one(i):
    name, src = triton_kernels.kernels()[i]
    k = triton_kernels.triton.compile(src, target=triton_kernels.TARGET)
    return name, hashlib.sha256(k.asm["cubin"]).hexdigest()


if __name__ == "__main__":
    n = int(sys.argv[1])
    with concurrent.futures.ProcessPoolExecutor(n, mp_context=mp.get_context("fork")) as ex:
        print(list(ex.map(compile_one, range(n))))
