"""Loads libfpt (the C library include/fpt.h documents) with ctypes and
declares its functions' types. Loaded on first use, not at import, so that
the launcher (fpt.run) never starts a Go runtime in its own process."""

import ctypes
import ctypes.util
import os

# Status codes, as fpt.h numbers them.
OK, ERR_ARG, ERR_STATE, ERR_KEY, ERR_SIZE, ERR_CONFIG, ERR_CLUSTER, ERR_INTERNAL = range(8)

# fpt_callback: void (*)(int64_t ts, int status, void* user_data).
CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p)
NO_CALLBACK = CALLBACK()  # NULL

# fpt_params_fn: int (*)(void* ctx, uint64_t iteration, uint64_t key, void* dst, uint64_t bytes).
PARAMS_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p,
                             ctypes.c_uint64)

_u64p = ctypes.POINTER(ctypes.c_uint64)
_intp = ctypes.POINTER(ctypes.c_int)
_PROTOS = {
    "fpt_last_error": (ctypes.c_char_p, []),
    "fpt_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "fpt_start": (ctypes.c_int, []),
    "fpt_finalize": (ctypes.c_int, []),
    "fpt_role": (ctypes.c_int, [_intp]),
    "fpt_rank": (ctypes.c_int, [_intp]),
    "fpt_num_workers": (ctypes.c_int, [_intp]),
    "fpt_num_workers_at": (ctypes.c_int, [ctypes.c_uint64, _intp]),
    "fpt_rank_at": (ctypes.c_int, [ctypes.c_uint64, _intp]),
    "fpt_num_servers": (ctypes.c_int, [_intp]),
    # The source as a plain pointer, so that None passes NULL.
    "fpt_set_params_source": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
    "fpt_start_iteration": (ctypes.c_int, [_u64p]),
    "fpt_joined": (ctypes.c_int, [_intp]),
    "fpt_set_tensors_per_iteration": (ctypes.c_int, [ctypes.c_int]),
    "fpt_declare": (ctypes.c_int, [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, ctypes.c_int]),
    "fpt_declare_wire": (ctypes.c_int, [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, ctypes.c_int, ctypes.c_int]),
    "fpt_init": (ctypes.c_int, [_u64p, ctypes.c_size_t, ctypes.c_void_p, _u64p]),
    "fpt_broadcast": (ctypes.c_int, [_u64p, ctypes.c_size_t, ctypes.c_void_p, _u64p]),
    "fpt_push": (ctypes.c_int, [_u64p, ctypes.c_size_t, ctypes.c_void_p, _u64p, ctypes.c_int,
                                CALLBACK, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]),
    "fpt_pull": (ctypes.c_int, [_u64p, ctypes.c_size_t, ctypes.c_void_p, _u64p,
                                CALLBACK, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]),
    "fpt_push_pull": (ctypes.c_int, [_u64p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, _u64p, ctypes.c_int,
                                     CALLBACK, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)]),
    "fpt_wait": (ctypes.c_int, [ctypes.c_int64]),
    "fpt_test": (ctypes.c_int, [ctypes.c_int64, _intp]),
    "fpt_barrier": (ctypes.c_int, []),
    "fpt_my_id": (ctypes.c_int, [_intp]),
    "fpt_group_ids": (ctypes.c_int, [ctypes.c_int, _intp, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "fpt_barrier_group": (ctypes.c_int, [ctypes.c_int]),
}


def native(name):
    """The path of a native file the wheel carries (libfpt.so, fpt) in the
    installed package, or None when this package runs from the source
    tree."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native", name)
    return path if os.path.exists(path) else None


def candidates():
    """Where libfpt may be, in the order tried: FPT_LIB, the one the wheel
    carries, the build tree this source file is in, then the system's
    library path."""
    out = []
    if os.environ.get("FPT_LIB"):
        return [os.environ["FPT_LIB"]]
    if native("libfpt.so"):
        out.append(native("libfpt.so"))
    here = os.path.dirname(os.path.abspath(__file__))
    out.append(os.path.normpath(os.path.join(here, "..", "..", "build", "lib", "libfpt.so")))
    found = ctypes.util.find_library("fpt")
    if found:
        out.append(found)
    return out


def load():
    """Opens libfpt and types its functions. CDLL releases the GIL during
    every call, so blocking calls (fpt_init, fpt_wait, fpt_finalize) let
    other Python threads and the library's callbacks run."""
    tried = candidates()
    path = next((p for p in tried if os.path.sep not in p or os.path.exists(p)), None)
    if path is None:
        raise OSError("libfpt.so not found (tried %s): build it with scripts/build.sh, or set FPT_LIB to its path"
                      % ", ".join(tried))
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in _PROTOS.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib
