#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

/* The last error, one buffer per thread: a C caller reads it right after a
 * failed call, on the thread that made it, so a thread-local buffer needs
 * no lock and nothing to free. Longer messages are cut. */
static __thread char last_error[1024];

const char* fpt_last_error(void) { return last_error; }

const char* fpt_status_name(int status) {
  switch (status) {
    case FPT_OK: return "FPT_OK";
    case FPT_ERR_ARG: return "FPT_ERR_ARG";
    case FPT_ERR_STATE: return "FPT_ERR_STATE";
    case FPT_ERR_KEY: return "FPT_ERR_KEY";
    case FPT_ERR_SIZE: return "FPT_ERR_SIZE";
    case FPT_ERR_CONFIG: return "FPT_ERR_CONFIG";
    case FPT_ERR_CLUSTER: return "FPT_ERR_CLUSTER";
    case FPT_ERR_INTERNAL: return "FPT_ERR_INTERNAL";
  }
  return "FPT_UNKNOWN_STATUS";
}

void fpt_set_last_error(const char* msg, size_t n) {
  if (n >= sizeof last_error) {
    n = sizeof last_error - 1;
  }
  if (n > 0) {
    memcpy(last_error, msg, n);
  }
  last_error[n] = '\0';
}

void fpt_invoke(fpt_callback cb, int64_t ts, int status, const char* msg, size_t n, uintptr_t user) {
  fpt_set_last_error(msg, n);
  cb(ts, status, (void*)user);
}

void fpt_invoke_msg(fpt_msg_handler handler, const fpt_msg_meta* meta, const fpt_segment* segs, size_t n,
                    const char* msg, size_t msg_len, uintptr_t user) {
  fpt_set_last_error(msg, msg_len);
  handler(meta, segs, n, (void*)user);
}

void fpt_invoke_msg_keep(fpt_msg_keep_handler handler, const fpt_msg_meta* meta, const fpt_segment* segs, size_t n,
                         void* block, const char* msg, size_t msg_len, uintptr_t user) {
  fpt_set_last_error(msg, msg_len);
  handler(meta, segs, n, block, (void*)user);
}


int fpt_invoke_params(fpt_params_fn fn, uintptr_t ctx, uint64_t iteration, uint64_t key, void* dst,
                      uint64_t bytes) {
  return fn((void*)ctx, iteration, key, dst, bytes);
}

/* Go's half of fpt_wait (main.go): the request's status at once, or
 * FPT_WAIT_PENDING once w is registered to be signalled. */
extern int fpt_go_wait(int64_t ts, fpt_waiter* w);

int fpt_wait(int64_t ts) {
  fpt_waiter w;
  memset(&w, 0, sizeof w);
  int status = fpt_go_wait(ts, &w);
  if (status == FPT_WAIT_PENDING) {
    while (__atomic_load_n(&w.done, __ATOMIC_ACQUIRE) == 0) {
      /* Returns at once if done is no longer 0, on a signal, or
       * spuriously: the loop looks again. */
      syscall(SYS_futex, &w.done, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
    }
    status = w.status;
    fpt_set_last_error(w.msg, w.n);
    free(w.msg);
  }
  return status;
}

void fpt_waiter_done(fpt_waiter* w, int status, const char* msg, size_t n) {
  char* m = NULL;
  if (n > 0) {
    m = malloc(n);
    if (m != NULL) {
      memcpy(m, msg, n);
    } else {
      n = 0;
    }
  }
  w->status = status;
  w->msg = m;
  w->n = n;
  int* done = &w->done;
  __atomic_store_n(done, 1, __ATOMIC_RELEASE);
  /* w may be gone once done is set (fpt_wait returned): the wake names
   * only its address, still mapped on the waiter's stack, and a futex
   * waiter that a wake meant for another finds its own word unchanged and
   * waits again. */
  syscall(SYS_futex, done, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
