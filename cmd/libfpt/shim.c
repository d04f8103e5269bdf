#include <stdlib.h>
#include <string.h>

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
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  int status = fpt_go_wait(ts, &w);
  if (status == FPT_WAIT_PENDING) {
    pthread_mutex_lock(&w.mu);
    while (!w.done) {
      pthread_cond_wait(&w.cv, &w.mu);
    }
    pthread_mutex_unlock(&w.mu);
    status = w.status;
    fpt_set_last_error(w.msg, w.n);
    free(w.msg);
  }
  pthread_cond_destroy(&w.cv);
  pthread_mutex_destroy(&w.mu);
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
  /* Signalled under the lock: fpt_wait destroys w once it sees done, which
   * it can only after this unlock. */
  pthread_mutex_lock(&w->mu);
  w->status = status;
  w->msg = m;
  w->n = n;
  w->done = 1;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}
