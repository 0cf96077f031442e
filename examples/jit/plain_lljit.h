// plain_lljit.h — the baseline of the LLVM benchmarks: an ORC LLJIT with
// the pipeline make_cached_lljit runs (the IR optimisation pipeline at the
// same level, then code generation at the same level, for this host) and no
// kcache code on the path: LLJIT's own compiler (one TargetMachine, reused),
// LLJIT's own linking layer and memory manager, and host symbols.
// Header-only and LLVM-only, so a benchmark that uses it links nothing of
// kcache for this JIT.
#pragma once

#include <memory>

#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/IRTransformLayer.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/Module.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Target/TargetMachine.h>

#include "kcache/llvm_compat.h"

namespace kjit {

inline llvm::OptimizationLevel plain_ir_level(unsigned level) {
  switch (level) {
    case 0:
      return llvm::OptimizationLevel::O0;
    case 1:
      return llvm::OptimizationLevel::O1;
    case 2:
      return llvm::OptimizationLevel::O2;
    default:
      return llvm::OptimizationLevel::O3;
  }
}

// An LLJIT for this host at `opt_level` (0-3) for both the IR pipeline and
// the code generator. The IR pipeline runs in the IR transform layer, on
// a TargetMachine of its own (for the target's cost model), as an LLJIT
// user would add it.
inline llvm::Expected<std::unique_ptr<llvm::orc::LLJIT>> make_plain_lljit(unsigned opt_level = 2) {
  auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!jtmb) return jtmb.takeError();
  jtmb->setCodeGenOptLevel(kcache::llvm::compat::codegen_opt_level(opt_level));
  auto tm = jtmb->createTargetMachine();
  if (!tm) return tm.takeError();
  llvm::orc::LLJITBuilder b;
  b.setJITTargetMachineBuilder(std::move(*jtmb));
  auto jit = b.create();
  if (!jit) return jit.takeError();
  std::shared_ptr<llvm::TargetMachine> pass_tm = std::move(*tm);
  (*jit)->getIRTransformLayer().setTransform(
      [pass_tm, opt_level](
          llvm::orc::ThreadSafeModule tsm,
          const llvm::orc::MaterializationResponsibility&) -> llvm::Expected<llvm::orc::ThreadSafeModule> {
        tsm.withModuleDo([&](llvm::Module& m) {
          llvm::PassBuilder pb(pass_tm.get());
          llvm::LoopAnalysisManager lam;
          llvm::FunctionAnalysisManager fam;
          llvm::CGSCCAnalysisManager cgam;
          llvm::ModuleAnalysisManager mam;
          pb.registerModuleAnalyses(mam);
          pb.registerCGSCCAnalyses(cgam);
          pb.registerFunctionAnalyses(fam);
          pb.registerLoopAnalyses(lam);
          pb.crossRegisterProxies(lam, fam, cgam, mam);
          llvm::OptimizationLevel level = plain_ir_level(opt_level);
          llvm::ModulePassManager mpm = level == llvm::OptimizationLevel::O0 ? pb.buildO0DefaultPipeline(level)
                                                                             : pb.buildPerModuleDefaultPipeline(level);
          mpm.run(m, mam);
        });
        return tsm;
      });
  auto gen = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess((*jit)->getDataLayout().getGlobalPrefix());
  if (!gen) return gen.takeError();
  (*jit)->getMainJITDylib().addGenerator(std::move(*gen));
  return jit;
}

}  // namespace kjit
