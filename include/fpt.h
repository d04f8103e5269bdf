/*
 * fpt.h - the C interface of fpt, a parameter server for synchronous
 * data-parallel training (a Go rewrite of FPT-ps-lite / dmlc ps-lite).
 *
 * Link with libfpt (pkg-config --cflags --libs fpt). The library holds one
 * node per process, configured by the same environment as ps-lite and
 * dmlc-tracker (DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT,
 * DMLC_NUM_SERVER, DMLC_NUM_WORKER, and fpt's FPT_* settings; see
 * docs/running.md). It is the Go runtime built as a shared library: keep to one
 * Go-built shared library per process, as two Go runtimes cannot share one.
 *
 * Life cycle, for every role (as ps::StartAsync / ps::Finalize):
 *
 *   fpt_start();          join the cluster (a worker or server returns once
 *                         every node has joined; the scheduler at once)
 *   ... worker calls ...  (workers only)
 *   fpt_finalize();       a worker leaves after its requests complete; the
 *                         scheduler and servers serve until the workers
 *                         have all finalized, then return
 *
 * A process runs one node: after fpt_finalize, fpt_start fails.
 *
 * Every function returns an fpt_status. On failure, fpt_last_error() says
 * why. No call crashes the process or hangs on a bad argument; calls that
 * wait for the cluster (fpt_start, fpt_init, fpt_wait, fpt_barrier,
 * fpt_finalize) return FPT_ERR_CLUSTER when a node dies (within
 * PS_HEARTBEAT_TIMEOUT seconds) instead of waiting forever.
 *
 * Every function is safe to call from any thread.
 */
#ifndef FPT_H
#define FPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this interface (2: nodes, groups and customers; 3: a
 * joinable worker's fpt_set_params_source, fpt_start_iteration, fpt_joined;
 * 4: fpt_customer_add_keep, fpt_msg_release). */
#define FPT_API_VERSION 4

/* Status codes. */
typedef enum fpt_status {
  FPT_OK = 0,
  FPT_ERR_ARG = 1,      /* a NULL pointer, a bad dtype or count, a key twice in one call */
  FPT_ERR_STATE = 2,    /* before fpt_start, after fpt_finalize, a worker call on another
                           role, or out of order (a pull of an iteration not yet pushed) */
  FPT_ERR_KEY = 3,      /* a key that was not declared with fpt_declare */
  FPT_ERR_SIZE = 4,     /* a length that disagrees with the key's declaration */
  FPT_ERR_CONFIG = 5,   /* a missing or malformed DMLC_* / PS_* / FPT_* variable */
  FPT_ERR_CLUSTER = 6,  /* the cluster failed (a node died), timed out or terminated */
  FPT_ERR_INTERNAL = 7  /* a bug in fpt; the message says where */
} fpt_status;

/* Roles, as DMLC_ROLE names them. */
typedef enum fpt_node_role {
  FPT_ROLE_SCHEDULER = 1,
  FPT_ROLE_SERVER = 2,
  FPT_ROLE_WORKER = 3
} fpt_node_role;

/* Element types. MXNet's mshadow flags map as kFloat32 -> FPT_FLOAT32,
 * kFloat64 -> FPT_FLOAT64, kFloat16 -> FPT_FLOAT16, kBfloat16 ->
 * FPT_BFLOAT16 (the values differ, so that a zeroed field is never a valid
 * type). Sums of the 16-bit types are added in float32 and rounded once. */
typedef enum fpt_dtype {
  FPT_FLOAT32 = 1,
  FPT_FLOAT64 = 2,
  FPT_FLOAT16 = 3,
  FPT_BFLOAT16 = 4
} fpt_dtype;

/*
 * The message of the last call on this thread that failed, or "" if the
 * last call succeeded. Every fpt_* function except this one sets it. The
 * string belongs to the library and stays valid until the next fpt_* call
 * on the same thread. Inside a callback it is the message of the request
 * that failed ("" on success).
 */
const char* fpt_last_error(void);

/*
 * The name of a status code ("FPT_ERR_KEY"), or "FPT_UNKNOWN_STATUS" for a
 * value that is none. The string is static. Does not change the last error.
 */
const char* fpt_status_name(int status);

/*
 * Joins the cluster as the node the environment describes. Read when
 * fpt_start is called (getenv), so setenv before it works.
 * FPT_ERR_CONFIG leaves the library as it was (fix the environment and call
 * again); after any other failure only fpt_finalize is left.
 */
int fpt_start(void);

/*
 * ps-lite's Start(customer_id), for a process whose threads each start as
 * a customer: the first call is fpt_start. On a worker, every further
 * customer that calls it while the cluster assembles registers with the
 * scheduler beside the process and counts as one of DMLC_NUM_WORKER
 * workers (for barriers, ps::NumWorkers and the sums; the process keeps
 * one id and one rank); each call returns once the cluster has started.
 * A worker customer after the start is FPT_ERR_STATE. On a server or the
 * scheduler a further call only waits for the start.
 */
int fpt_start_customer(int customer_id);

/*
 * Leaves the cluster (see the life cycle above) and releases every thread,
 * socket and buffer the library holds. A worker first waits for its
 * outstanding requests (for at most 30 s; then the node fails and they
 * complete with FPT_ERR_CLUSTER). When it returns, every callback has
 * returned. Calls made once it has begun return FPT_ERR_STATE. Call it
 * once; not from a callback.
 */
int fpt_finalize(void);

/* The node's role (an fpt_node_role); readable before fpt_start (from DMLC_ROLE). */
int fpt_role(int* role);

/* The node's rank among the workers, or among the servers; 0 for the
 * scheduler. Only after fpt_start. A worker's is the one it started with
 * (fpt_rank_at is its dense rank of an iteration). A server's is dense at
 * every moment, 0 to the number of servers - 1: when a server is lost, the
 * ranks of those after it close up, and a server that joined has the next
 * one once the job counts it (-1 until then, and while a server leaves). */
int fpt_rank(int* rank);

/* DMLC_NUM_WORKER and DMLC_NUM_SERVER; readable before fpt_start. */
int fpt_num_workers(int* num_workers);
int fpt_num_servers(int* num_servers);

/* How many workers' pushes the sums of a key's iteration add up: what to
 * divide them by to average. A key's iteration n is its n-th fpt_push (0:
 * fpt_init). DMLC_NUM_WORKER, unless a worker was lost under
 * FPT_ON_WORKER_LOSS=continue: from the iteration its loss took effect at,
 * the sums add up the workers left. Final once a pull of that iteration
 * has completed. Workers only, after fpt_start. */
int fpt_num_workers_at(uint64_t iteration, int* num_workers);

/* This worker's rank among those of fpt_num_workers_at(iteration), 0 to
 * that count - 1: fpt_rank until a worker is lost, then dense again over
 * the workers left (what to shard data by). Workers only, after fpt_start. */
int fpt_rank_at(uint64_t iteration, int* rank);

/*
 * A worker joining a running job. A worker process started with the job's
 * environment while the job runs (the LB's grants must run: FPT_LB=on,
 * FPT_ON_SERVER_LOSS=retry or FPT_ON_WORKER_LOSS=continue|wait) is
 * admitted with a new rank (at least DMLC_NUM_WORKER), and the sums count
 * its pushes from the first iteration no worker has pushed yet, J. It must
 * start from the parameters the others have at the start of J; the library
 * holds sums, not parameters, so the program hands them over through a
 * parameters source, which every worker of a job that may be joined
 * registers, before its first fpt_push. On the joiner, fpt_init does no
 * init round and waits at no barrier: it returns the keys' parameters in
 * vals, and its first fpt_push is of iteration J (fpt_start_iteration).
 *
 * fn(ctx, iteration, key, dst, bytes) copies key's parameters as they are
 * at the start of iteration (before that iteration's sums are applied) into
 * dst: exactly bytes, the key's declared size, laid out as its pushes are.
 * It returns 0, or non-zero on failure: the joining worker then fails,
 * told the code, key and iteration. It is called on one worker only (the
 * one with the lowest rank among the workers of both iteration J-1 and J),
 * once for every declared key, during its first fpt_push of iteration J:
 * on the thread calling that fpt_push, before its values are sent and
 * before it returns. A program that pushes an iteration's gradients before
 * applying its sums (any synchronous trainer) has the right values then.
 * fn must not call fpt_push, fpt_pull, fpt_wait or fpt_barrier. NULL
 * removes the source: a worker that then tries to join fails, saying so.
 * Workers only, after fpt_start.
 */
typedef int (*fpt_params_fn)(void* ctx, uint64_t iteration, uint64_t key, void* dst, uint64_t bytes);
int fpt_set_params_source(fpt_params_fn fn, void* ctx);

/* The iteration of this worker's first fpt_push after fpt_init: 1 on a
 * worker that started with the job, J on one that joined it (known once
 * fpt_init has returned; 0 before). Workers only, after fpt_start. */
int fpt_start_iteration(uint64_t* iteration);

/* *joined is 1 if this worker joined a running job, 0 if it started with
 * it. Workers only, after fpt_start. */
int fpt_joined(int* joined);

/*
 * Workers only, from here on.
 *
 * Announces how many tensors one iteration pushes (FPT's kvstore announces
 * it once the model's parameters are known). Declaring more keys than that
 * then fails, which catches a model and a launch that disagree. Optional.
 */
int fpt_set_tensors_per_iteration(int num_tensors);

/*
 * Declares a tensor: its key, its size in bytes (a whole number of
 * elements of dtype), its element type and its priority (larger goes
 * first; MXNet uses minus the layer index). Every worker declares the same
 * tensors before any of them pushes. Declaring a key again with the same
 * size and type only changes its priority.
 */
int fpt_declare(uint64_t key, uint64_t bytes, int dtype, int priority);

/*
 * fpt_declare with a compressed wire: the key's values are float32 in the
 * program's memory (dtype FPT_FLOAT32, bytes its float32 size, which calls
 * pass as lens) and travel as wire, FPT_BFLOAT16 or FPT_FLOAT16, in half
 * the bytes: each push rounds them to wire, aggregators sum in float32 and
 * round the sum once, each pull widens it back to float32 (exactly). wire 0
 * (or dtype) is fpt_declare. One call takes keys of one wire type.
 */
int fpt_declare_wire(uint64_t key, uint64_t bytes, int dtype, int priority, int wire);

/*
 * Callback of an asynchronous request. Called exactly once for every
 * request whose fpt_push/fpt_pull returned FPT_OK, with FPT_OK or the
 * request's failure (fpt_last_error() has the message), on a thread of the
 * library, before fpt_wait(ts) returns. It may call fpt_push and fpt_pull;
 * it must not call fpt_wait on its own request or fpt_finalize.
 */
typedef void (*fpt_callback)(int64_t ts, int status, void* user_data);

/*
 * Tensors in calls: keys[i] owns lens[i] bytes of vals, laid end to end
 * (as ps-lite's ZPush(keys, vals, lens) with byte lengths). lens[i] must
 * be the key's declared size, and all keys of one call share one dtype.
 * keys, lens and vals may be NULL only when num_keys (or the byte total)
 * is 0. The library never copies the tensor: vals must stay valid (and,
 * for a push, unmodified; for a pull, unread) until the request's callback
 * runs or fpt_wait(ts) returns. keys and lens are read during the call only.
 */

/*
 * Sets the keys' starting values on every worker to worker 0's vals
 * (MXNet's kvstore init): on every worker vals holds worker 0's values when
 * it returns. Collective: every worker calls it with the same keys, before
 * their first push. Blocks. On a worker that joined a running job, vals
 * holds the keys' parameters at the start of its first iteration instead
 * (see fpt_set_params_source).
 */
int fpt_init(const uint64_t* keys, size_t num_keys, void* vals, const uint64_t* lens);

/*
 * fpt_init for keys that no iteration pushes again: a model's buffers, an
 * optimizer's state, values a program keeps in step itself. Every worker
 * gets worker 0's values; the iterations after it complete without these
 * keys (FPT_ON_SERVER_LOSS=retry and FPT_ON_WORKER_LOSS=continue|wait
 * wait for every key an iteration pushes: keys given values by fpt_init
 * and never pushed again would hold every iteration back), and a push of
 * one of them fails. Collective and blocking, as fpt_init.
 */
int fpt_broadcast(const uint64_t* keys, size_t num_keys, void* vals, const uint64_t* lens);

/*
 * FPTPush: sends one iteration's values of the keys (a key's n-th push is
 * its iteration n; fpt_init is iteration 0) to the aggregators that sum
 * them over the workers and send every worker the sum. Asynchronous: *ts
 * (if ts is not NULL) receives the request's timestamp for fpt_wait; cb, if
 * not NULL, is called once vals is free again: when the values have left
 * or, with FPT_ON_SERVER_LOSS=retry or FPT_ON_WORKER_LOSS=continue, once
 * every worker has the sums of their iteration (a retry after a lost node
 * pushes them again). Under either, do not wait for one key's push before
 * pushing the same iteration's other keys: it completes only once they are
 * all summed.
 */
int fpt_push(const uint64_t* keys, size_t num_keys, const void* vals, const uint64_t* lens,
             int priority, fpt_callback cb, void* user_data, int64_t* ts);

/*
 * FPTPull: the sums of the keys' next unpulled iteration into vals, once
 * they have arrived (a pull of an iteration not pushed yet is
 * FPT_ERR_STATE). Asynchronous, like fpt_push; cb is called when vals holds
 * the sums (under FPT_ON_SERVER_LOSS=retry, a pull into the vals of its own
 * push completes with that push; under FPT_ON_WORKER_LOSS=continue every
 * pull completes once every worker has its iteration's sums, which a lost
 * worker's retry sums again: fpt_num_workers_at says over how many). Between fpt_init and the keys' next push, a pull gives the
 * values fpt_init left (worker 0's), as MXNet's broadcast of a parameter
 * (init, then pull) needs; the library keeps a copy of them until then
 * (outside the Go heap, freed at the keys' next push).
 */
int fpt_pull(const uint64_t* keys, size_t num_keys, void* vals, const uint64_t* lens,
             fpt_callback cb, void* user_data, int64_t* ts);

/*
 * fpt_push of vals and fpt_pull of the same iteration's sums into outs, in
 * one request: outs (vals' size; it may be vals itself) holds the sums
 * over the workers when cb runs or fpt_wait(ts) returns. Every key's sum
 * has its place before the first value leaves, so it is read once, into
 * outs, where a pull made after its push may find it arrived and copy it.
 * vals must stay unmodified, and outs unread, until then.
 */
int fpt_push_pull(const uint64_t* keys, size_t num_keys, const void* vals, void* outs,
                  const uint64_t* lens, int priority, fpt_callback cb, void* user_data, int64_t* ts);

/*
 * Blocks until request ts has completed and its callback returned, and
 * returns its status. A failed request's status goes to the first
 * fpt_wait that asks; later waits on it return FPT_OK.
 */
int fpt_wait(int64_t ts);

/*
 * Without blocking, sets *done to 1 if request ts has completed and its
 * callback returned (fpt_wait(ts) would return at once), else 0. A
 * program that waits with fpt_wait needs no callback: with cb NULL a
 * request's completion wakes its fpt_wait directly, on no other thread.
 */
int fpt_test(int64_t ts, int* done);

/* Blocks until every worker has called it (ps-lite's barrier over the
 * worker group). */
int fpt_barrier(void);

/*
 * Nodes and groups, for every role, after fpt_start.
 *
 * Node ids are ps-lite's: the scheduler is 1, server r is 8+2r, worker r is
 * 9+2r. Groups are ps-lite's too and combine with |.
 */
#define FPT_GROUP_SCHEDULER 1
#define FPT_GROUP_SERVERS 2
#define FPT_GROUP_WORKERS 4

/* This node's id. */
int fpt_my_id(int* id);

/*
 * The ids of the nodes in group_or_id (a group, or a single node id >= 8),
 * ascending, into ids[0..cap); *n receives how many there are (which may
 * exceed cap: then only cap are written). An id that is no node of the
 * cluster is FPT_ERR_ARG. A worker process of several customers
 * (fpt_start_customer) is one node, one id, in the workers' group, though
 * each of its customers counts in fpt_num_workers.
 */
int fpt_group_ids(int group_or_id, int* ids, size_t cap, size_t* n);

/*
 * ps::Postoffice::Barrier: blocks until every server and worker in group
 * has called it with the same group. The scheduler takes part in no
 * barrier: the FPT_GROUP_SCHEDULER bit is ignored (alone, the call returns
 * FPT_OK at once), and on the scheduler the call returns FPT_OK at once.
 * A group of 0 or above 7, or one this node is not in, is FPT_ERR_ARG.
 * Fails with FPT_ERR_CLUSTER when a node dies.
 */
int fpt_barrier_group(int group);

/*
 * Messages between customers (ps-lite's Customer and Message, on which
 * ps::KVWorker, ps::KVServer and ps::SimpleApp are built; include/ps/ does
 * that over these calls). Every node has customers, the scheduler too (as
 * in ps-lite); the scheduler has no data plane, so messages to and from it
 * travel over the control plane (at most 32 MiB each), and its customers'
 * first send waits for every node to have registered.
 *
 * A customer is a handler registered under (app_id, customer_id). A
 * message is delivered to a customer of its recipient as ps-lite does: on a
 * server or the scheduler to (meta.app_id, meta.app_id), on a worker to
 * (meta.app_id, meta.customer_id). Each customer's handler runs on a thread of the
 * library of its own, one message at a time, in the order the messages
 * arrived (per sender, the order they were sent). Messages for a customer
 * not registered yet wait for it, for up to FPT_START_TIMEOUT seconds; then
 * the node fails, naming the app and customer.
 *
 * Messages of one priority from one sender arrive in the order sent; a
 * message of higher priority may overtake (the send pool, as ps-lite's
 * priority van). A handler sees meta->recipient as this node's id.
 *
 * When the cluster fails (a node died, or this one failed), every
 * registered customer's handler is called once more with FPT_MSG_FAILED in
 * meta->flags, sender 0 and no data; fpt_last_error() then says why.
 * Messages still queued are dropped, and none is delivered after that. A
 * program that waits for responses waits on that too, so it never hangs.
 * After a failure fpt_customer_add and fpt_msg_send return FPT_ERR_CLUSTER.
 * fpt_finalize waits for running handlers: a handler that never returns
 * holds it up.
 */
#define FPT_MSG_REQUEST 1u  /* a request (else a response to one) */
#define FPT_MSG_PUSH 2u     /* ps-lite's meta.push */
#define FPT_MSG_PULL 4u     /* ps-lite's meta.pull */
#define FPT_MSG_SIMPLE 8u   /* a SimpleApp message (ps-lite's meta.simple_app) */
#define FPT_MSG_FAILED 16u  /* delivered only: the cluster failed; no data */

/* The most segments one message carries (ps-lite's keys, vals, lens). */
#define FPT_MSG_MAX_SEGMENTS 4

typedef struct fpt_msg_meta {
  int32_t app_id;
  int32_t customer_id;
  int32_t timestamp;  /* the requester's; a response echoes its request's */
  int32_t head;       /* a KV request's cmd, a SimpleApp message's head */
  int32_t sender;     /* set by the library on delivery; ignored by fpt_msg_send */
  int32_t recipient;  /* a node id (not a group) */
  uint32_t flags;     /* FPT_MSG_* */
  int32_t dtype;      /* an fpt_dtype when the data hold tensor values, else 0 */
  int32_t priority;   /* larger is sent first, as for pushes */
} fpt_msg_meta;

/* One segment of a message's data. */
typedef struct fpt_segment {
  const void* data;
  uint64_t bytes;
} fpt_segment;

/*
 * A customer's handler. meta and segs[i].data are valid during the call
 * only: copy what you keep. It may call fpt_msg_send (a KVServer responds
 * from its handler) but must not block on a response to its own customer.
 */
typedef void (*fpt_msg_handler)(const fpt_msg_meta* meta, const fpt_segment* segs, size_t num_segs,
                                void* user_data);

/* Registers handler as customer (app_id, customer_id). Registering a
 * customer that exists is FPT_ERR_ARG. */
int fpt_customer_add(int app_id, int customer_id, fpt_msg_handler handler, void* user_data);

/*
 * A handler that may keep a message past the call: when block is not NULL
 * the segments lie in block, the library's memory, which is the handler's
 * from then on: it stays valid until fpt_msg_release(block), which the
 * handler (or whatever it hands the data to) calls exactly once, from any
 * thread, at any time (after fpt_finalize too). When block is NULL the
 * segments are valid during the call only, as for fpt_msg_handler (the
 * FPT_MSG_FAILED call, and messages the library did not read into memory
 * of its own: those from this node itself or over the scheduler's control
 * plane). Segment data in block start 8-byte aligned when every segment
 * before them has a length that is a multiple of 8.
 */
typedef void (*fpt_msg_keep_handler)(const fpt_msg_meta* meta, const fpt_segment* segs, size_t num_segs,
                                     void* block, void* user_data);

/* fpt_customer_add for a handler that keeps messages (fpt_msg_keep_handler):
 * a receiver that reads values in place saves a copy of every message. */
int fpt_customer_add_keep(int app_id, int customer_id, fpt_msg_keep_handler handler, void* user_data);

/* Gives back the block of a message an fpt_msg_keep_handler kept: the
 * library keeps a bounded number of such blocks to read later messages
 * into (memory already touched, where fresh memory would be faulted in
 * page by page), and frees the rest, and all of them at fpt_finalize. */
void fpt_msg_release(void* block);

/* Removes a customer. When it returns, its handler is not running and will
 * not run again; messages that arrive for it afterwards are dropped with a
 * warning. Not from the customer's own handler. */
int fpt_customer_remove(int app_id, int customer_id);

/*
 * Sends a message to meta->recipient (this node itself included). When it
 * returns the data have been written to the socket from where they lie
 * (or, to this node itself, copied): the buffers are free again. The encoded
 * message (the data, 24 bytes of meta and 8 per segment) is at most
 * FPT_MAX_FRAME_BYTES. Asynchronous otherwise: the response, if any, comes
 * to the customer's handler. A recipient that is no node of the cluster
 * (a group, an unknown id), more than FPT_MSG_MAX_SEGMENTS segments, a bad dtype, a
 * flag other than FPT_MSG_REQUEST/PUSH/PULL/SIMPLE, or a message too large
 * is FPT_ERR_ARG.
 */
int fpt_msg_send(const fpt_msg_meta* meta, const fpt_segment* segs, size_t num_segs);

#ifdef __cplusplus
}
#endif

#endif /* FPT_H */
