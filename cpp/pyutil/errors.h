// ftjit: Python-error helpers every floor above uses: clearing an error
// without losing a Ctrl-C.
//
// Shared state: none. Lock order: takes no locks; runs Python (imports and
// calls of `threading` and `signal`), so never under a C++ lock.
#pragma once

namespace ftjit {

// PyErr_Clear for best-effort code (building an error message, copying an
// exception, running a logging hook), except that a KeyboardInterrupt is not
// dropped: PyObject_Repr/Str run the signal handlers first, so a Ctrl-C
// arriving there surfaces as their failure. On the main thread with Python's
// default SIGINT handler it is re-armed as a pending SIGINT, which the
// interpreter's next signal check raises (elsewhere re-arming could fire in
// another thread, or run a custom handler twice, so it is dropped as before).
void ClearErrorKeepingInterrupt();

}  // namespace ftjit
