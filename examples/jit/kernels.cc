// Kernel generation, interpretation and lowering to LLVM IR (see kernels.h).
#include "kernels.h"

#include <cmath>
#include <cstdio>

#include <llvm/IR/BasicBlock.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

namespace kjit {

namespace {

// splitmix64: small, fast and identical everywhere.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  unsigned below(unsigned n) { return static_cast<unsigned>(next() % n); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

double apply(const Node& nd, const std::vector<double>& v, double a, double b, double c) {
  switch (nd.op) {
    case Op::in_a:
      return a;
    case Op::in_b:
      return b;
    case Op::in_c:
      return c;
    case Op::constant:
      return nd.value;
    case Op::add:
      return v[nd.x] + v[nd.y];
    case Op::sub:
      return v[nd.x] - v[nd.y];
    case Op::mul:
      return v[nd.x] * v[nd.y];
    case Op::div:
      return v[nd.x] / (std::fabs(v[nd.y]) + 1.0);
    case Op::neg:
      return -v[nd.x];
    case Op::exp:
      return std::exp(std::fmin(v[nd.x], 30.0));
    case Op::log:
      return std::log(std::fabs(v[nd.x]) + 1.0);
    case Op::sqrt:
      return std::sqrt(std::fabs(v[nd.x]));
    case Op::tanh:
      return std::tanh(v[nd.x]);
    case Op::min:
      return std::fmin(v[nd.x], v[nd.y]);
    case Op::max:
      return std::fmax(v[nd.x], v[nd.y]);
    case Op::select:
      return v[nd.p] < v[nd.q] ? v[nd.x] : v[nd.y];
  }
  return 0;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::in_a:
      return "a";
    case Op::in_b:
      return "b";
    case Op::in_c:
      return "c";
    case Op::constant:
      return "const";
    case Op::add:
      return "+";
    case Op::sub:
      return "-";
    case Op::mul:
      return "*";
    case Op::div:
      return "div";
    case Op::neg:
      return "neg";
    case Op::exp:
      return "exp";
    case Op::log:
      return "log";
    case Op::sqrt:
      return "sqrt";
    case Op::tanh:
      return "tanh";
    case Op::min:
      return "min";
    case Op::max:
      return "max";
    case Op::select:
      return "select";
  }
  return "?";
}

}  // namespace

Kernel generate(uint64_t index) {
  Rng r{index * 0x2545f4914f6cdd1dull + 17};
  Kernel k;
  k.name = "k" + std::to_string(index);
  unsigned rk = r.below(4);
  k.reduce = rk == 0 ? Reduce::sum : rk == 1 ? Reduce::max : Reduce::none;
  k.nodes.push_back({Op::in_a});
  k.nodes.push_back({Op::in_b});
  k.nodes.push_back({Op::in_c});
  unsigned n_ops = 24 + r.below(40);
  // Operands lean towards recent nodes so expressions grow deep, not wide.
  auto pick = [&]() -> int {
    int n = static_cast<int>(k.nodes.size());
    if (r.below(3) == 0) return static_cast<int>(r.below(static_cast<unsigned>(n)));
    int w = std::min(n, 6);
    return n - 1 - static_cast<int>(r.below(static_cast<unsigned>(w)));
  };
  static const Op kOps[] = {Op::add, Op::add,  Op::sub,  Op::mul,  Op::mul, Op::div, Op::neg,    Op::exp,
                            Op::log, Op::sqrt, Op::tanh, Op::tanh, Op::min, Op::max, Op::select, Op::constant};
  for (unsigned i = 0; i < n_ops; ++i) {
    Node nd{kOps[r.below(sizeof kOps / sizeof kOps[0])]};
    if (nd.op == Op::constant) {
      nd.value = std::round((r.unit() * 4.0 - 2.0) * 1000.0) / 1000.0;
      k.nodes.push_back(nd);
      nd = Node{Op::mul};
      nd.x = static_cast<int>(k.nodes.size()) - 1;
      nd.y = pick();
    } else {
      nd.x = pick();
      nd.y = pick();
      if (nd.op == Op::select) {
        nd.p = pick();
        nd.q = pick();
      }
    }
    k.nodes.push_back(nd);
  }
  // Keep results in a sane range for sums over many elements.
  Node last{Op::tanh};
  last.x = static_cast<int>(k.nodes.size()) - 1;
  k.nodes.push_back(last);
  return k;
}

std::string Kernel::to_string() const {
  std::string s = name + (reduce == Reduce::sum ? " = sum " : reduce == Reduce::max ? " = max " : " = map ");
  s += "{";
  char buf[96];
  for (size_t i = 3; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op == Op::constant) {
      std::snprintf(buf, sizeof buf, " t%zu=%g;", i, n.value);
    } else if (n.op == Op::select) {
      std::snprintf(buf, sizeof buf, " t%zu=select(t%d<t%d,t%d,t%d);", i, n.p, n.q, n.x, n.y);
    } else {
      std::snprintf(buf, sizeof buf, " t%zu=%s(t%d,t%d);", i, op_name(n.op), n.x, n.y);
    }
    s += buf;
  }
  return s + " }";
}

std::string Kernel::encode() const {
  // Field by field (a Node has padding bytes, which must not be hashed).
  std::string out = name;
  out.push_back('\0');
  out.push_back(static_cast<char>(reduce));
  out.reserve(out.size() + nodes.size() * 25);
  for (const Node& n : nodes) {
    out.push_back(static_cast<char>(n.op));
    for (int v : {n.x, n.y, n.p, n.q}) out.append(reinterpret_cast<const char*>(&v), sizeof v);
    out.append(reinterpret_cast<const char*>(&n.value), sizeof n.value);
  }
  return out;
}

void evaluate(const Kernel& k, const double* a, const double* b, const double* c, double* out, int64_t n) {
  std::vector<double> v(k.nodes.size());
  double acc = k.reduce == Reduce::max ? -INFINITY : 0.0;
  for (int64_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < k.nodes.size(); ++j) v[j] = apply(k.nodes[j], v, a[i], b[i], c[i]);
    double r = v.back();
    if (k.reduce == Reduce::none)
      out[i] = r;
    else if (k.reduce == Reduce::sum)
      acc = acc + r;
    else
      acc = std::fmax(acc, r);
  }
  if (k.reduce != Reduce::none) out[0] = acc;
}

std::unique_ptr<llvm::Module> lower(const Kernel& k, llvm::LLVMContext& ctx) {
  using namespace llvm;
  auto m = std::make_unique<Module>(k.name, ctx);
  m->setSourceFileName(k.name + ".k");
  Type* f64 = Type::getDoubleTy(ctx);
  Type* i64 = Type::getInt64Ty(ctx);
  Type* ptr = PointerType::getUnqual(f64);
  auto* fty = FunctionType::get(Type::getVoidTy(ctx), {ptr, ptr, ptr, ptr, i64}, false);
  Function* f = Function::Create(fty, Function::ExternalLinkage, k.name, *m);
  for (unsigned i = 0; i < 4; ++i) f->addParamAttr(i, Attribute::NoAlias);
  f->addFnAttr(Attribute::NoUnwind);
  Argument* pa = f->getArg(0);
  Argument* pb = f->getArg(1);
  Argument* pc = f->getArg(2);
  Argument* pout = f->getArg(3);
  Argument* pn = f->getArg(4);

  FunctionCallee tanh_fn = m->getOrInsertFunction("tanh", FunctionType::get(f64, {f64}, false));
  if (auto* tf = dyn_cast<Function>(tanh_fn.getCallee())) {
    tf->setDoesNotThrow();
    tf->setOnlyReadsMemory();
  }
  Function* exp_i = Intrinsic::getDeclaration(m.get(), Intrinsic::exp, {f64});
  Function* log_i = Intrinsic::getDeclaration(m.get(), Intrinsic::log, {f64});
  Function* sqrt_i = Intrinsic::getDeclaration(m.get(), Intrinsic::sqrt, {f64});
  Function* fabs_i = Intrinsic::getDeclaration(m.get(), Intrinsic::fabs, {f64});
  Function* min_i = Intrinsic::getDeclaration(m.get(), Intrinsic::minnum, {f64});
  Function* max_i = Intrinsic::getDeclaration(m.get(), Intrinsic::maxnum, {f64});

  BasicBlock* entry = BasicBlock::Create(ctx, "entry", f);
  BasicBlock* loop = BasicBlock::Create(ctx, "loop", f);
  BasicBlock* exit = BasicBlock::Create(ctx, "exit", f);
  IRBuilder<> bld(entry);
  Value* init = ConstantFP::get(f64, k.reduce == Reduce::max ? -INFINITY : 0.0);
  bld.CreateCondBr(bld.CreateICmpSGT(pn, ConstantInt::get(i64, 0)), loop, exit);

  bld.SetInsertPoint(loop);
  PHINode* iv = bld.CreatePHI(i64, 2, "i");
  iv->addIncoming(ConstantInt::get(i64, 0), entry);
  PHINode* acc = nullptr;
  if (k.reduce != Reduce::none) {
    acc = bld.CreatePHI(f64, 2, "acc");
    acc->addIncoming(init, entry);
  }
  Value* one = ConstantFP::get(f64, 1.0);
  std::vector<Value*> v(k.nodes.size());
  for (size_t j = 0; j < k.nodes.size(); ++j) {
    const Node& nd = k.nodes[j];
    Value* x = nd.x >= 0 ? v[nd.x] : nullptr;
    Value* y = nd.y >= 0 ? v[nd.y] : nullptr;
    switch (nd.op) {
      case Op::in_a:
        v[j] = bld.CreateLoad(f64, bld.CreateInBoundsGEP(f64, pa, iv));
        break;
      case Op::in_b:
        v[j] = bld.CreateLoad(f64, bld.CreateInBoundsGEP(f64, pb, iv));
        break;
      case Op::in_c:
        v[j] = bld.CreateLoad(f64, bld.CreateInBoundsGEP(f64, pc, iv));
        break;
      case Op::constant:
        v[j] = ConstantFP::get(f64, nd.value);
        break;
      case Op::add:
        v[j] = bld.CreateFAdd(x, y);
        break;
      case Op::sub:
        v[j] = bld.CreateFSub(x, y);
        break;
      case Op::mul:
        v[j] = bld.CreateFMul(x, y);
        break;
      case Op::div:
        v[j] = bld.CreateFDiv(x, bld.CreateFAdd(bld.CreateCall(fabs_i, {y}), one));
        break;
      case Op::neg:
        v[j] = bld.CreateFNeg(x);
        break;
      case Op::exp:
        v[j] = bld.CreateCall(exp_i, {bld.CreateCall(min_i, {x, ConstantFP::get(f64, 30.0)})});
        break;
      case Op::log:
        v[j] = bld.CreateCall(log_i, {bld.CreateFAdd(bld.CreateCall(fabs_i, {x}), one)});
        break;
      case Op::sqrt:
        v[j] = bld.CreateCall(sqrt_i, {bld.CreateCall(fabs_i, {x})});
        break;
      case Op::tanh:
        v[j] = bld.CreateCall(tanh_fn, {x});
        break;
      case Op::min:
        v[j] = bld.CreateCall(min_i, {x, y});
        break;
      case Op::max:
        v[j] = bld.CreateCall(max_i, {x, y});
        break;
      case Op::select:
        v[j] = bld.CreateSelect(bld.CreateFCmpOLT(v[nd.p], v[nd.q]), x, y);
        break;
    }
  }
  Value* r = v.back();
  Value* next_acc = nullptr;
  if (k.reduce == Reduce::none) {
    bld.CreateStore(r, bld.CreateInBoundsGEP(f64, pout, iv));
  } else {
    next_acc = k.reduce == Reduce::sum ? bld.CreateFAdd(acc, r) : bld.CreateCall(max_i, {acc, r});
    acc->addIncoming(next_acc, loop);
  }
  Value* inext = bld.CreateAdd(iv, ConstantInt::get(i64, 1), "", /*HasNUW=*/true, /*HasNSW=*/true);
  iv->addIncoming(inext, loop);
  bld.CreateCondBr(bld.CreateICmpSLT(inext, pn), loop, exit);

  bld.SetInsertPoint(exit);
  if (k.reduce != Reduce::none) {
    PHINode* fin = bld.CreatePHI(f64, 2);
    fin->addIncoming(init, entry);
    fin->addIncoming(next_acc, loop);
    bld.CreateStore(fin, pout);
  }
  bld.CreateRetVoid();
  return m;
}

}  // namespace kjit
