"""Triton kernels compiled without a GPU for sm_90 (the ptxas in Triton's
wheel): elementwise, softmax, layernorm and matmul at several block sizes.
Used by the Python tests and bench/triton_bench.py.

    python triton_kernels.py [N]   compiles the first N kernels (all by
                                    default) and prints one line per kernel:
                                    name, sha256 of the cubin, compile source
"""

import hashlib
import inspect
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

TARGET = GPUTarget("cuda", 90, 32)


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = 0.5 * x * (1 + tl.math.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offs, y, mask=mask)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * in_stride + offs, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * out_stride + offs, num / tl.sum(num, axis=0), mask=mask)


@triton.jit
def layernorm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    rstd = 1 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(y_ptr + row * stride + offs, d * rstd * w + b, mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None] * sam + rk[None, :] * sak
    b = b_ptr + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        acc += tl.dot(tl.load(a), tl.load(b))
        a += BK * sak
        b += BK * sbk
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc.to(tl.float16))


def ast_source(fn, sig, constexprs):
    """ASTSource across Triton 3.x: named signature and constexprs (3.3 and
    later), named signature and constants (3.2), or positional signature and
    constants (3.0, 3.1)."""
    if "constexprs" in inspect.signature(ASTSource.__init__).parameters:
        return ASTSource(fn, sig, constexprs=constexprs)
    names = fn.arg_names
    try:
        return ASTSource(fn, {i: sig[n] for i, n in enumerate(names) if sig[n] != "constexpr"},
                         constants={names.index(n): v for n, v in constexprs.items()})
    except TypeError:  # 3.2: keys are names
        return ASTSource(fn, dict(sig), constants=dict(constexprs))


def _elementwise(fn, nptr, block):
    names = fn.arg_names
    sig = {names[i]: "*fp32" for i in range(nptr)}
    sig[names[nptr]] = "i32"
    sig["BLOCK"] = "constexpr"
    return ast_source(fn, sig, {"BLOCK": block})


def kernels():
    """(name, ASTSource) for each test kernel."""
    out = [
        ("add_1024", _elementwise(add_kernel, 3, 1024)),
        ("add_256", _elementwise(add_kernel, 3, 256)),
        ("gelu_512", _elementwise(gelu_kernel, 2, 512)),
    ]
    for block in (256, 1024):
        sig = {"out_ptr": "*fp32", "in_ptr": "*fp32", "in_stride": "i32", "out_stride": "i32", "n_cols": "i32",
               "BLOCK": "constexpr"}
        out.append((f"softmax_{block}", ast_source(softmax_kernel, sig, {"BLOCK": block})))
    for block in (512, 2048):
        sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "w_ptr": "*fp32", "b_ptr": "*fp32", "stride": "i32",
               "n_cols": "i32", "eps": "fp32", "BLOCK": "constexpr"}
        out.append((f"layernorm_{block}", ast_source(layernorm_kernel, sig, {"BLOCK": block})))
    for bm, bn, bk in ((64, 64, 32), (128, 128, 32), (128, 64, 64)):
        sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32",
               "sam": "i32", "sak": "i32", "sbk": "i32", "sbn": "i32", "scm": "i32", "scn": "i32",
               "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
        out.append((f"matmul_{bm}x{bn}x{bk}",
                    ast_source(matmul_kernel, sig, {"BM": bm, "BN": bn, "BK": bk})))
    return out


def compile_all(n=None):
    """Compiles the first n kernels; [(name, sha256 of cubin)]."""
    res = []
    for name, src in kernels()[:n]:
        k = triton.compile(src, target=TARGET)
        res.append((name, hashlib.sha256(k.asm["cubin"]).hexdigest()))
    return res


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else None
    for name, digest in compile_all(n):
        print(name, digest)
