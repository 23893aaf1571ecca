// ftjit: the Python objects the jit floor raises, builds and calls (see
// Imported).
#pragma once

#include "pyutil/imported.h"

namespace ftjit {

// ftjit.errors: what a call or a compile raises.
inline Imported kRecursiveCompileError{"ftjit.errors", "RecursiveCompileError"};
inline Imported kCompileCycleError{"ftjit.errors", "CompileCycleError"};
inline Imported kCompileTimeoutError{"ftjit.errors", "CompileTimeoutError"};
inline Imported kRecompileLimitError{"ftjit.errors", "RecompileLimitError"};
// Records and helpers of ftjit's Python API.
inline Imported kRegistryFlatten{"ftjit._hooks", "RegistryFlatten"};
inline Imported kSignatureInfo{"ftjit._jit", "SignatureInfo"};
inline Imported kRebuild{"ftjit._jit", "_rebuild"};
inline Imported kJitModule{"ftjit._jit", "__dict__"};
inline Imported kWarmup{"ftjit._warmup", "warmup"};
inline Imported kWarmupSpecs{"ftjit._specs", "warmup_specs"};
// Logging hooks: on_compile(name, signature, seconds, error or None) and
// on_wait(name, signature, seconds); miss explanations and the
// max_signatures message.
inline Imported kOnCompile{"ftjit._observe", "on_compile"};
inline Imported kOnWait{"ftjit._observe", "on_wait"};
inline Imported kOnMiss{"ftjit._explain", "on_miss"};
// The standard library's.
inline Imported kCopy{"copy", "copy"};
inline Imported kPartial{"functools", "partial"};

}  // namespace ftjit
