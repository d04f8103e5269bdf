/*
 * fpt_bad_calls calls every entry point of libfpt wrongly, before
 * fpt_start, while running and after fpt_finalize, and checks that each
 * returns the documented status with a message, never crashing or hanging;
 * in between it checks that correct calls still work. Written in C, so
 * that fpt.h is compiled as C as well as C++.
 *
 * Run it as the only worker of a cluster (DMLC_NUM_WORKER=1, one or more
 * servers). It prints "BAD CALLS PASS" and exits 0, or lists what failed
 * and exits 1.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <fpt.h>

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures;

/* expect checks a call's status and message: want_msg must appear in
 * fpt_last_error() on failure; on success the message must be empty. */
static void expect(int line, const char* call, int got, int want, const char* want_msg) {
  const char* msg = fpt_last_error();
  int ok = got == want;
  if (want == FPT_OK) {
    ok = ok && msg[0] == '\0';
  } else {
    ok = ok && msg[0] != '\0' && (want_msg == NULL || strstr(msg, want_msg) != NULL);
  }
  printf("%s line %d: %s = %d: %s\n", ok ? "ok  " : "FAIL", line, call, got, msg);
  if (!ok) {
    fprintf(stderr, "line %d: %s = %d (%s), want %d containing \"%s\"\n", line, call, got, msg, want,
            want_msg ? want_msg : "");
    failures++;
  }
}

#define EXPECT(call, want, msg) expect(__LINE__, #call, (call), (want), (msg))

static int callbacks;
static int callback_status = -1;

static void on_done(int64_t ts, int status, void* user) {
  (void)ts;
  callbacks++;
  callback_status = status;
  *(int*)user = 1;
}

/* A parameters source (never called here: no worker joins this job). */
static int params_calls;
static int params_fn(void* ctx, uint64_t iteration, uint64_t key, void* dst, uint64_t bytes) {
  (void)ctx, (void)iteration, (void)key, (void)dst, (void)bytes;
  params_calls++;
  return 1;
}

/* The calls that need a started worker, each of which must fail with the
 * same status and message in the current state. */
static void every_worker_call(int want, const char* want_msg) {
  uint64_t key = 1, len = 4, it = 0;
  float v = 0;
  int64_t ts = 0;
  int out = 0;
  EXPECT(fpt_rank(&out), want, want_msg);
  EXPECT(fpt_num_workers_at(1, &out), want, want_msg);
  EXPECT(fpt_rank_at(1, &out), want, want_msg);
  EXPECT(fpt_set_params_source(params_fn, NULL), want, want_msg);
  EXPECT(fpt_start_iteration(&it), want, want_msg);
  EXPECT(fpt_joined(&out), want, want_msg);
  EXPECT(fpt_set_tensors_per_iteration(1), want, want_msg);
  EXPECT(fpt_declare(1, 4, FPT_FLOAT32, 0), want, want_msg);
  EXPECT(fpt_init(&key, 1, &v, &len), want, want_msg);
  EXPECT(fpt_broadcast(&key, 1, &v, &len), want, want_msg);
  EXPECT(fpt_push(&key, 1, &v, &len, 0, NULL, NULL, &ts), want, want_msg);
  EXPECT(fpt_pull(&key, 1, &v, &len, NULL, NULL, &ts), want, want_msg);
  EXPECT(fpt_push_pull(&key, 1, &v, &v, &len, 0, NULL, NULL, &ts), want, want_msg);
  EXPECT(fpt_wait(1), want, want_msg);
  EXPECT(fpt_barrier(), want, want_msg);
}

static void on_msg(const fpt_msg_meta* meta, const fpt_segment* segs, size_t num_segs, void* user);

static void on_keep(const fpt_msg_meta* meta, const fpt_segment* segs, size_t num_segs, void* block, void* user) {
  (void)meta;
  (void)segs;
  (void)num_segs;
  (void)user;
  fpt_msg_release(block);
}

/* The node, group and customer calls (fpt.h API version 2 on), each of
 * which must fail with the same status and message in the current state. */
static void every_customer_call(int want, const char* want_msg) {
  int out = 0, ids[4];
  size_t n = 0;
  fpt_msg_meta meta = {0};
  meta.recipient = 9;
  EXPECT(fpt_my_id(&out), want, want_msg);
  EXPECT(fpt_group_ids(FPT_GROUP_WORKERS, ids, 4, &n), want, want_msg);
  EXPECT(fpt_barrier_group(FPT_GROUP_WORKERS), want, want_msg);
  EXPECT(fpt_customer_add(0, 0, on_msg, NULL), want, want_msg);
  EXPECT(fpt_customer_add_keep(0, 0, on_keep, NULL), want, want_msg);
  EXPECT(fpt_customer_remove(0, 0), want, want_msg);
  EXPECT(fpt_msg_send(&meta, NULL, 0), want, want_msg);
}

/* What the customer (3, 7) received. */
static atomic_int msgs;
static fpt_msg_meta first_meta;
static size_t first_segs;
static char first_body[16];
static int first_empty_ok, first_error_empty, reply_status = -1;

static void on_msg(const fpt_msg_meta* meta, const fpt_segment* segs, size_t num_segs, void* user) {
  (void)user;
  if (atomic_load(&msgs) == 0) {
    first_meta = *meta;
    first_segs = num_segs;
    if (num_segs == 3 && segs[0].bytes < sizeof first_body) {
      memcpy(first_body, segs[0].data, segs[0].bytes);
    }
    first_empty_ok = num_segs == 3 && segs[1].data == NULL && segs[1].bytes == 0 && segs[2].bytes == 2 * sizeof(float);
    first_error_empty = fpt_last_error()[0] == '\0';
    /* A handler may send: a response to the same customer. */
    fpt_msg_meta r = *meta;
    r.flags = 0;
    r.recipient = meta->sender;
    reply_status = fpt_msg_send(&r, NULL, 0);
  }
  atomic_fetch_add(&msgs, 1);
}

/* The node, group and customer calls while running: bad arguments, and a
 * message to a customer of this worker itself (the servers are fpt's own,
 * which register no customer). */
static void customer_calls(void) {
  int id = 0, ids[8] = {0};
  size_t n = 0;
  int servers = 0;
  EXPECT(fpt_num_servers(&servers), FPT_OK, NULL);
  EXPECT(fpt_my_id(NULL), FPT_ERR_ARG, "NULL");
  EXPECT(fpt_my_id(&id), FPT_OK, NULL);
  if (id != 9) {
    fprintf(stderr, "fpt_my_id = %d, want 9 (worker 0)\n", id);
    failures++;
  }
  EXPECT(fpt_group_ids(FPT_GROUP_WORKERS, ids, 8, NULL), FPT_ERR_ARG, "NULL");
  EXPECT(fpt_group_ids(FPT_GROUP_WORKERS, NULL, 8, &n), FPT_ERR_ARG, "ids is NULL");
  EXPECT(fpt_group_ids(0, ids, 8, &n), FPT_ERR_ARG, "no group");
  EXPECT(fpt_group_ids(5 + 3, ids, 8, &n), FPT_OK, NULL); /* server 0, an id */
  EXPECT(fpt_group_ids(-4, ids, 8, &n), FPT_ERR_ARG, "no group");
  EXPECT(fpt_group_ids(99, ids, 8, &n), FPT_ERR_ARG, "no node");
  EXPECT(fpt_group_ids(9 + 2 * 1, ids, 8, &n), FPT_ERR_ARG, "no node"); /* worker 1 of 1 */
  EXPECT(fpt_group_ids(FPT_GROUP_WORKERS, ids, 8, &n), FPT_OK, NULL);
  if (n != 1 || ids[0] != 9) {
    fprintf(stderr, "workers: %zu ids, first %d; want 1, 9\n", n, ids[0]);
    failures++;
  }
  EXPECT(fpt_group_ids(FPT_GROUP_SCHEDULER | FPT_GROUP_SERVERS | FPT_GROUP_WORKERS, NULL, 0, &n), FPT_OK, NULL);
  if (n != (size_t)(2 + servers)) {
    fprintf(stderr, "all nodes: %zu ids, want %d\n", n, 2 + servers);
    failures++;
  }
  ids[1] = -1;
  EXPECT(fpt_group_ids(FPT_GROUP_SCHEDULER | FPT_GROUP_SERVERS, ids, 1, &n), FPT_OK, NULL);
  if (n != (size_t)(1 + servers) || ids[0] != 1 || ids[1] != -1) {
    fprintf(stderr, "scheduler and servers, cap 1: %zu ids, %d %d; want %d, 1, untouched\n", n, ids[0], ids[1], 1 + servers);
    failures++;
  }

  EXPECT(fpt_barrier_group(0), FPT_ERR_ARG, "no group");
  EXPECT(fpt_barrier_group(8), FPT_ERR_ARG, "no group");
  EXPECT(fpt_barrier_group(FPT_GROUP_SERVERS), FPT_ERR_ARG, "not in group");
  EXPECT(fpt_barrier_group(FPT_GROUP_WORKERS), FPT_OK, NULL);
  EXPECT(fpt_barrier_group(FPT_GROUP_WORKERS | FPT_GROUP_SCHEDULER), FPT_OK, NULL);
  EXPECT(fpt_barrier_group(FPT_GROUP_SCHEDULER), FPT_OK, NULL); /* nobody to wait for */

  EXPECT(fpt_customer_add(3, 7, NULL, NULL), FPT_ERR_ARG, "handler is NULL");
  EXPECT(fpt_customer_add_keep(3, 7, NULL, NULL), FPT_ERR_ARG, "handler is NULL");
  EXPECT(fpt_customer_add(3, 7, on_msg, NULL), FPT_OK, NULL);
  EXPECT(fpt_customer_add(3, 7, on_msg, NULL), FPT_ERR_ARG, "already");
  EXPECT(fpt_customer_remove(3, 8), FPT_ERR_ARG, "not registered");

  static const char hello[] = "hello";
  static float vals[2] = {1.5f, -2};
  static char big[16];
  fpt_segment segs[5] = {{hello, 5}, {NULL, 0}, {vals, sizeof vals}, {NULL, 0}, {NULL, 0}};
  fpt_msg_meta m = {0};
  m.app_id = 3;
  m.customer_id = 7;
  m.timestamp = 5;
  m.head = 42;
  m.recipient = 9;
  m.sender = 12345; /* ignored */
  m.flags = FPT_MSG_REQUEST | FPT_MSG_SIMPLE;
  m.dtype = FPT_FLOAT32;
  fpt_msg_meta bad = m;
  EXPECT(fpt_msg_send(NULL, segs, 3), FPT_ERR_ARG, "meta is NULL");
  EXPECT(fpt_msg_send(&m, NULL, 3), FPT_ERR_ARG, "segs is NULL");
  EXPECT(fpt_msg_send(&m, segs, 5), FPT_ERR_ARG, "FPT_MSG_MAX_SEGMENTS");
  EXPECT(fpt_msg_send(&m, segs, SIZE_MAX), FPT_ERR_ARG, "FPT_MSG_MAX_SEGMENTS");
  bad.recipient = FPT_GROUP_SERVERS + FPT_GROUP_SCHEDULER;
  EXPECT(fpt_msg_send(&bad, segs, 3), FPT_ERR_ARG, "recipient");
  bad.recipient = FPT_GROUP_SERVERS;
  EXPECT(fpt_msg_send(&bad, segs, 3), FPT_ERR_ARG, "recipient");
  bad.recipient = 99;
  EXPECT(fpt_msg_send(&bad, segs, 3), FPT_ERR_ARG, "no node of this cluster");
  bad.recipient = -8;
  EXPECT(fpt_msg_send(&bad, segs, 3), FPT_ERR_ARG, "recipient");
  bad = m;
  bad.dtype = 9;
  EXPECT(fpt_msg_send(&bad, segs, 3), FPT_ERR_ARG, "dtype");
  bad.dtype = -1;
  EXPECT(fpt_msg_send(&bad, segs, 3), FPT_ERR_ARG, "dtype");
  bad = m;
  bad.flags = FPT_MSG_FAILED;
  EXPECT(fpt_msg_send(&bad, segs, 3), FPT_ERR_ARG, "flags");
  fpt_segment null_data[1] = {{NULL, 4}};
  EXPECT(fpt_msg_send(&m, null_data, 1), FPT_ERR_ARG, "data is NULL");
  fpt_segment too_big[1] = {{big, (uint64_t)1 << 40}}; /* never read: refused first */
  EXPECT(fpt_msg_send(&m, too_big, 1), FPT_ERR_ARG, "FPT_MAX_FRAME_BYTES");
  fpt_segment wraps[1] = {{big, UINT64_MAX}};
  EXPECT(fpt_msg_send(&m, wraps, 1), FPT_ERR_SIZE, "address space");

  /* A message to this node's own customer, and the handler's reply. */
  EXPECT(fpt_msg_send(&m, segs, 3), FPT_OK, NULL);
  for (int i = 0; i < 1000 && atomic_load(&msgs) < 2; i++) {
    struct timespec ms = {0, 10 * 1000 * 1000};
    nanosleep(&ms, NULL);
  }
  if (atomic_load(&msgs) != 2 || first_meta.sender != 9 || first_meta.recipient != 9 || first_meta.head != 42 ||
      first_meta.timestamp != 5 || first_meta.app_id != 3 || first_meta.customer_id != 7 ||
      first_meta.flags != (FPT_MSG_REQUEST | FPT_MSG_SIMPLE) || first_meta.dtype != FPT_FLOAT32 || first_segs != 3 ||
      strcmp(first_body, "hello") != 0 || !first_empty_ok || !first_error_empty || reply_status != FPT_OK) {
    fprintf(stderr,
            "customer (3, 7): %d messages; first from %d to %d head %d ts %d app %d customer %d flags %u dtype %d, "
            "%zu segments, body \"%s\", empty/vals ok %d, last error empty %d, reply %d\n",
            atomic_load(&msgs), first_meta.sender, first_meta.recipient, first_meta.head, first_meta.timestamp,
            first_meta.app_id, first_meta.customer_id, first_meta.flags, first_meta.dtype, first_segs, first_body,
            first_empty_ok, first_error_empty, reply_status);
    failures++;
  }
  EXPECT(fpt_customer_remove(3, 7), FPT_OK, NULL);
  EXPECT(fpt_customer_remove(3, 7), FPT_ERR_ARG, "not registered");
}

int main(void) {
  int out = -1;
  int role = 0;
  /* Before fpt_start: the role and sizes come from the environment. */
  EXPECT(fpt_role(NULL), FPT_ERR_ARG, "NULL");
  EXPECT(fpt_role(&role), FPT_OK, NULL);
  if (role != FPT_ROLE_WORKER) {
    fprintf(stderr, "fpt_bad_calls runs as a worker (DMLC_ROLE=worker), not role %d\n", role);
    return 1;
  }
  EXPECT(fpt_num_workers(NULL), FPT_ERR_ARG, "NULL");
  /* Status names: every code's own, and the last error left alone. */
  EXPECT(fpt_role(NULL), FPT_ERR_ARG, "NULL");
  {
    static const struct { int status; const char* name; } names[] = {
        {FPT_OK, "FPT_OK"},         {FPT_ERR_ARG, "FPT_ERR_ARG"},         {FPT_ERR_STATE, "FPT_ERR_STATE"},
        {FPT_ERR_KEY, "FPT_ERR_KEY"}, {FPT_ERR_SIZE, "FPT_ERR_SIZE"},     {FPT_ERR_CONFIG, "FPT_ERR_CONFIG"},
        {FPT_ERR_CLUSTER, "FPT_ERR_CLUSTER"}, {FPT_ERR_INTERNAL, "FPT_ERR_INTERNAL"}, {-1, "FPT_UNKNOWN_STATUS"},
        {8, "FPT_UNKNOWN_STATUS"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      const char* got = fpt_status_name(names[i].status);
      int ok = strcmp(got, names[i].name) == 0;
      printf("%s fpt_status_name(%d) = %s\n", ok ? "ok  " : "FAIL", names[i].status, got);
      if (!ok) failures++;
    }
    if (strstr(fpt_last_error(), "NULL") == NULL) {
      printf("FAIL fpt_status_name changed the last error to \"%s\"\n", fpt_last_error());
      failures++;
    }
  }
  EXPECT(fpt_num_servers(&out), FPT_OK, NULL);
  every_worker_call(FPT_ERR_STATE, "fpt_start has not been called");
  every_customer_call(FPT_ERR_STATE, "fpt_start has not been called");
  EXPECT(fpt_finalize(), FPT_ERR_STATE, "fpt_start has not been called");

  /* A bad environment: FPT_ERR_CONFIG naming the variable, and the library
   * can still start once it is fixed. */
  const char* nw = getenv("DMLC_NUM_WORKER");
  char saved[32];
  snprintf(saved, sizeof saved, "%s", nw ? nw : "");
  setenv("DMLC_NUM_WORKER", "many", 1);
  EXPECT(fpt_num_workers(&out), FPT_ERR_CONFIG, "DMLC_NUM_WORKER");
  EXPECT(fpt_start(), FPT_ERR_CONFIG, "DMLC_NUM_WORKER");
  setenv("DMLC_NUM_WORKER", saved, 1);

  EXPECT(fpt_start(), FPT_OK, NULL);
  if (failures > 0) {
    return 1; /* without a node the rest means nothing */
  }
  EXPECT(fpt_start(), FPT_ERR_STATE, "already");
  EXPECT(fpt_rank(&out), FPT_OK, NULL);
  EXPECT(fpt_num_workers(&out), FPT_OK, NULL);
  if (out != 1) {
    fprintf(stderr, "fpt_bad_calls needs DMLC_NUM_WORKER=1, got %d\n", out);
    return 1;
  }
  EXPECT(fpt_num_workers_at(7, NULL), FPT_ERR_ARG, "NULL");
  out = -1;
  EXPECT(fpt_num_workers_at(7, &out), FPT_OK, NULL);
  if (out != 1) {
    printf("FAIL fpt_num_workers_at(7) = %d, want 1\n", out);
    failures++;
  }
  EXPECT(fpt_rank_at(7, NULL), FPT_ERR_ARG, "NULL");
  out = -1;
  EXPECT(fpt_rank_at(7, &out), FPT_OK, NULL);
  if (out != 0) {
    printf("FAIL fpt_rank_at(7) = %d, want 0\n", out);
    failures++;
  }

  /* A joinable worker's calls: this one started with the job. */
  uint64_t start_it = 0;
  EXPECT(fpt_start_iteration(NULL), FPT_ERR_ARG, "NULL");
  EXPECT(fpt_joined(NULL), FPT_ERR_ARG, "NULL");
  EXPECT(fpt_joined(&out), FPT_OK, NULL);
  EXPECT(fpt_start_iteration(&start_it), FPT_OK, NULL);
  if (out != 0 || start_it != 1) {
    printf("FAIL fpt_joined = %d, fpt_start_iteration = %llu; want 0 and 1 on a worker that started the job\n", out,
           (unsigned long long)start_it);
    failures++;
  }
  EXPECT(fpt_set_params_source(params_fn, &out), FPT_OK, NULL);
  EXPECT(fpt_set_params_source(NULL, NULL), FPT_OK, NULL); /* removes it */
  EXPECT(fpt_set_params_source(params_fn, NULL), FPT_OK, NULL);

  /* Declarations. */
  EXPECT(fpt_set_tensors_per_iteration(0), FPT_ERR_ARG, "at least 1");
  EXPECT(fpt_set_tensors_per_iteration(3), FPT_OK, NULL);
  enum { N1 = 1000, N2 = 300000 }; /* key 2: 2.3 MiB, three partitions */
  EXPECT(fpt_declare(1, N1 * sizeof(float), FPT_FLOAT32, 0), FPT_OK, NULL);
  EXPECT(fpt_declare(2, N2 * sizeof(double), FPT_FLOAT64, -1), FPT_OK, NULL);
  EXPECT(fpt_declare(3, 10, FPT_FLOAT32, 0), FPT_ERR_SIZE, "whole number");
  EXPECT(fpt_declare(3, 16, 0, 0), FPT_ERR_ARG, "dtype");
  EXPECT(fpt_declare(3, 16, 99, 0), FPT_ERR_ARG, "dtype");
  EXPECT(fpt_declare(1, 8, FPT_FLOAT32, 0), FPT_ERR_SIZE, "already declared");
  EXPECT(fpt_declare(1, N1 * sizeof(float), FPT_FLOAT64, 0), FPT_ERR_SIZE, "already declared");
  EXPECT(fpt_declare(1, N1 * sizeof(float), FPT_FLOAT32, 5), FPT_OK, NULL); /* a new priority */
  EXPECT(fpt_declare(3, 64, FPT_FLOAT16, -2), FPT_OK, NULL);
  EXPECT(fpt_declare(4, 64, FPT_FLOAT32, 0), FPT_ERR_ARG, "3 tensors per iteration");

  static float a[N1], a_sum[N1];
  static double b[N2], b_sum[N2];
  uint64_t k1 = 1, k2 = 2, k99 = 99;
  uint64_t l1 = sizeof a, l2 = sizeof b;
  uint64_t keys12[2] = {1, 2}, lens12[2] = {sizeof a, sizeof b};
  uint64_t keys11[2] = {1, 1}, lens11[2] = {sizeof a, sizeof a};
  uint64_t huge[2] = {UINT64_MAX, 8};
  int64_t ts = 0;

  /* Null pointers, unknown keys, sizes that disagree, bad counts. */
  EXPECT(fpt_push(NULL, 1, a, &l1, 0, NULL, NULL, &ts), FPT_ERR_ARG, "keys is NULL");
  EXPECT(fpt_push(&k1, 1, a, NULL, 0, NULL, NULL, &ts), FPT_ERR_ARG, "lens is NULL");
  EXPECT(fpt_push(&k1, 1, NULL, &l1, 0, NULL, NULL, &ts), FPT_ERR_ARG, "vals is NULL");
  EXPECT(fpt_pull(&k1, 1, NULL, &l1, NULL, NULL, &ts), FPT_ERR_ARG, "vals is NULL");
  EXPECT(fpt_push_pull(&k1, 1, NULL, a_sum, &l1, 0, NULL, NULL, &ts), FPT_ERR_ARG, "vals is NULL");
  EXPECT(fpt_push_pull(&k1, 1, a, NULL, &l1, 0, NULL, NULL, &ts), FPT_ERR_ARG, "outs is NULL");
  EXPECT(fpt_push_pull(&k99, 1, a, a_sum, &l1, 0, NULL, NULL, &ts), FPT_ERR_KEY, "key 99");
  EXPECT(fpt_push_pull(&k1, 1, b, b, &l2, 0, NULL, NULL, &ts), FPT_ERR_SIZE, "declared as 4000 bytes");
  EXPECT(fpt_init(&k1, 1, NULL, &l1), FPT_ERR_ARG, "vals is NULL");
  EXPECT(fpt_push(&k1, SIZE_MAX, a, &l1, 0, NULL, NULL, &ts), FPT_ERR_ARG, "keys in one call");
  EXPECT(fpt_push(&k99, 1, a, &l1, 0, NULL, NULL, &ts), FPT_ERR_KEY, "key 99");
  EXPECT(fpt_pull(&k99, 1, a, &l1, NULL, NULL, &ts), FPT_ERR_KEY, "key 99");
  EXPECT(fpt_init(&k99, 1, a, &l1), FPT_ERR_KEY, "key 99");
  EXPECT(fpt_push(&k1, 1, a, &l2, 0, NULL, NULL, &ts), FPT_ERR_SIZE, "declared as 4000 bytes");
  EXPECT(fpt_push(keys12, 2, a, huge, 0, NULL, NULL, &ts), FPT_ERR_SIZE, "overflows");
  EXPECT(fpt_push(keys12, 2, b, lens12, 0, NULL, NULL, &ts), FPT_ERR_ARG, "one dtype");
  EXPECT(fpt_push(keys11, 2, b, lens11, 0, NULL, NULL, &ts), FPT_ERR_ARG, "twice");
  EXPECT(fpt_pull(&k1, 1, a_sum, &l1, NULL, NULL, &ts), FPT_ERR_STATE, "not pushed");
  EXPECT(fpt_wait(0), FPT_ERR_ARG, "no request 0");
  EXPECT(fpt_wait(12345), FPT_ERR_ARG, "no request 12345");
  EXPECT(fpt_push(NULL, 0, NULL, NULL, 0, NULL, NULL, NULL), FPT_OK, NULL); /* nothing to push is fine */

  /* The library still works: init, then one iteration with callbacks. */
  for (int i = 0; i < N1; i++) a[i] = (float)(i % 100);
  for (int i = 0; i < N2; i++) b[i] = (double)(i % 1000);
  EXPECT(fpt_init(&k1, 1, a, &l1), FPT_OK, NULL);
  EXPECT(fpt_init(&k2, 1, b, &l2), FPT_OK, NULL);
  uint64_t k3 = 3, l3 = 64;
  uint16_t h[32] = {0};
  EXPECT(fpt_broadcast(&k3, 1, NULL, &l3), FPT_ERR_ARG, "vals is NULL");
  EXPECT(fpt_broadcast(&k3, 1, h, &l3), FPT_OK, NULL); /* never pushed again */
  EXPECT(fpt_init(&k1, 1, a, &l1), FPT_ERR_ARG, "pushed already");
  EXPECT(fpt_push(&k3, 1, h, &l3, 0, NULL, NULL, &ts), FPT_ERR_ARG, "was broadcast");

  int pushed = 0, pulled = 0;
  int64_t push_ts = 0, pull_ts = 0, b_ts = 0;
  EXPECT(fpt_push(&k1, 1, a, &l1, 0, on_done, &pushed, &push_ts), FPT_OK, NULL);
  EXPECT(fpt_pull(&k1, 1, a_sum, &l1, on_done, &pulled, &pull_ts), FPT_OK, NULL);
  EXPECT(fpt_push(&k2, 1, b, &l2, -1, NULL, NULL, NULL), FPT_OK, NULL); /* no ts, no callback */
  EXPECT(fpt_pull(&k2, 1, b_sum, &l2, NULL, NULL, &b_ts), FPT_OK, NULL);
  EXPECT(fpt_pull(&k2, 1, b_sum, &l2, NULL, NULL, &ts), FPT_ERR_STATE, "not pushed");
  EXPECT(fpt_wait(pull_ts), FPT_OK, NULL);
  EXPECT(fpt_wait(push_ts), FPT_OK, NULL);
  EXPECT(fpt_wait(push_ts), FPT_OK, NULL); /* twice is fine */
  EXPECT(fpt_wait(b_ts), FPT_OK, NULL);
  if (!pushed || !pulled || callbacks != 2 || callback_status != FPT_OK) {
    fprintf(stderr, "callbacks: pushed %d pulled %d, %d calls, last status %d\n", pushed, pulled, callbacks,
            callback_status);
    failures++;
  }
  for (int i = 0; i < N1; i++) {
    if (a_sum[i] != a[i]) { /* one worker: the sum is its own push */
      fprintf(stderr, "key 1 element %d = %g, want %g\n", i, a_sum[i], a[i]);
      failures++;
      break;
    }
  }
  for (int i = 0; i < N2; i++) {
    if (b_sum[i] != (double)(i % 1000)) {
      fprintf(stderr, "key 2 element %d = %g, want %d\n", i, b_sum[i], i % 1000);
      failures++;
      break;
    }
  }
  if (params_calls != 0) {
    printf("FAIL the parameters source was called %d times with no worker joining\n", params_calls);
    failures++;
  }
  EXPECT(fpt_barrier(), FPT_OK, NULL);
  customer_calls();
  EXPECT(fpt_finalize(), FPT_OK, NULL);

  /* After fpt_finalize: everything is refused, nothing hangs. */
  every_worker_call(FPT_ERR_STATE, "fpt_finalize was called");
  every_customer_call(FPT_ERR_STATE, "fpt_finalize was called");
  EXPECT(fpt_role(&out), FPT_ERR_STATE, "fpt_finalize was called");
  EXPECT(fpt_num_servers(&out), FPT_ERR_STATE, "fpt_finalize was called");
  EXPECT(fpt_start(), FPT_ERR_STATE, "cannot start again");
  EXPECT(fpt_finalize(), FPT_ERR_STATE, "fpt_finalize was called");

  if (failures > 0) {
    printf("BAD CALLS FAIL: %d\n", failures);
    return 1;
  }
  printf("BAD CALLS PASS\n");
  return 0;
}
