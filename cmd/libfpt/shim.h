/* The C side of libfpt's cgo shell: helpers main.go calls, not part of
 * the library's interface (fpt.h), hence hidden from the shared library's
 * symbol table. */
#ifndef FPT_SHIM_H
#define FPT_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "fpt.h"

/* Sets this thread's last error to the n bytes at msg (n may be 0). */
__attribute__((visibility("hidden"))) void fpt_set_last_error(const char* msg, size_t n);

/* Calls cb(ts, status, user) with the thread's last error set to msg: Go
 * cannot call a C function pointer itself. user travels as an integer so
 * that Go never holds it as a pointer (it may be any value). */
__attribute__((visibility("hidden"))) void fpt_invoke(fpt_callback cb, int64_t ts, int status,
                                                      const char* msg, size_t n, uintptr_t user);

/* Calls handler(meta, segs, n, user) with the thread's last error set to
 * msg (a customer's failure notice; "" for a message). */
__attribute__((visibility("hidden"))) void fpt_invoke_msg(fpt_msg_handler handler, const fpt_msg_meta* meta,
                                                          const fpt_segment* segs, size_t n, const char* msg,
                                                          size_t msg_len, uintptr_t user);

/* Calls fn(ctx, iteration, key, dst, bytes) and returns its status: a
 * parameters source (fpt_set_params_source). */
__attribute__((visibility("hidden"))) void fpt_invoke_msg_keep(fpt_msg_keep_handler handler, const fpt_msg_meta* meta,
                                                               const fpt_segment* segs, size_t n, void* block,
                                                               const char* msg, size_t msg_len, uintptr_t user);

__attribute__((visibility("hidden"))) int fpt_invoke_params(fpt_params_fn fn, uintptr_t ctx, uint64_t iteration,
                                                            uint64_t key, void* dst, uint64_t bytes);

/* A thread blocked in fpt_wait: the goroutine that releases the request
 * fills in its status and message, sets done and wakes it (a futex on
 * done: fpt_waiter_done), so the thread wakes in C, never waiting for the
 * Go scheduler to hand it back its goroutine, and no lock is taken on
 * either side (a condition variable signalled under its mutex woke the
 * waiter into that mutex, still held: a second wake-up). It lives on
 * fpt_wait's stack. */
typedef struct {
  int done; /* set last, with release order; the futex word */
  int status;
  char* msg; /* malloc'd, or NULL */
  size_t n;
} fpt_waiter;

/* fpt_wait's answer from Go while the request is outstanding: w will be
 * signalled. Not a status fpt.h names. */
#define FPT_WAIT_PENDING (-1)

__attribute__((visibility("hidden"))) void fpt_waiter_done(fpt_waiter* w, int status, const char* msg, size_t n);

#endif
