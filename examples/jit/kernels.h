// A small kernel language for the JIT demo: element-wise expressions over
// three input arrays a, b, c of doubles, with an optional reduction.
//
// A kernel is a DAG in SSA order: node i uses only nodes < i; the last node
// is the result. Per element i:
//   map kernels:    out[i] = result(a[i], b[i], c[i])
//   reduce kernels: out[0] = sum_i result(...)   or   max_i result(...)
// Operations are total on finite doubles (no traps, no domain errors):
//   log(x) = log(|x| + 1)   sqrt(x) = sqrt(|x|)   exp(x) = exp(min(x, 30))
//   div(x, y) = x / (|y| + 1)   select(p, q, x, y) = p < q ? x : y
//   min/max follow C fmin/fmax; tanh is C tanh.
// The interpreter (evaluate) defines the meaning; lower() emits LLVM IR that
// computes the same values with the same operation order, so results agree
// bit for bit unless fast-math is enabled.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace kjit {

enum class Op : uint8_t { in_a, in_b, in_c, constant, add, sub, mul, div, neg, exp, log, sqrt, tanh, min, max, select };
enum class Reduce : uint8_t { none, sum, max };

struct Node {
  Op op;
  int x = -1, y = -1, p = -1, q = -1;  // operands (node indices)
  double value = 0;                    // constants
};

struct Kernel {
  std::string name;
  Reduce reduce = Reduce::none;
  std::vector<Node> nodes;
  std::string to_string() const;  // readable source form
  // Compact, exact bytes of the kernel (name, reduction, every node): what
  // the front end reads, for hashing into a front-end key.
  std::string encode() const;
};

// Kernel number `index`, the same in every process.
Kernel generate(uint64_t index);

// Reference semantics: fills out (n elements for map kernels, 1 for reduce).
void evaluate(const Kernel& k, const double* a, const double* b, const double* c, double* out, int64_t n);

// `void name(const double* noalias a, b, c, double* noalias out, i64 n)` in a
// fresh module named after the kernel.
std::unique_ptr<llvm::Module> lower(const Kernel& k, llvm::LLVMContext& ctx);

using KernelFn = void (*)(const double*, const double*, const double*, double*, int64_t);

}  // namespace kjit
