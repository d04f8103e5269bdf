/*
 * ps/ps.h - ps-lite's interface on fpt: include this, link libfpt.
 *
 *   g++ -std=c++11 prog.cc $(pkg-config --cflags --libs fpt)
 *
 * A process runs one node, configured by the DMLC_* environment (see
 * fpt's docs/running.md); ps::Start joins the cluster, ps::Finalize leaves it. See
 * ps/internal/postoffice.h for how ps-lite's life cycle maps onto libfpt's,
 * and docs/c-cpp.md for what is supported.
 */
#ifndef PS_PS_H_
#define PS_PS_H_

#include <functional>

#include "ps/base.h"
#include "ps/kv_app.h"
#include "ps/simple_app.h"

namespace ps {

/* DMLC_NUM_WORKER and DMLC_NUM_SERVER (also before Start). */
inline int NumWorkers() { return Postoffice::Get()->num_workers(); }
inline int NumServers() { return Postoffice::Get()->num_servers(); }
/* The role, from DMLC_ROLE (also before Start). */
inline bool IsWorker() { return Postoffice::Get()->is_worker(); }
inline bool IsServer() { return Postoffice::Get()->is_server(); }
inline bool IsScheduler() { return Postoffice::Get()->is_scheduler(); }
/* The rank among the workers, or among the servers (after Start). */
inline int MyRank() { return Postoffice::Get()->my_rank(); }

/* Joins the cluster (the first call; see postoffice.h). Returns once every
 * node has joined. */
inline void Start(int customer_id, const char* argv0 = nullptr) {
  Postoffice::Get()->Start(customer_id, argv0, true);
}
/* The same: libfpt's start always waits for the cluster. */
inline void StartAsync(int customer_id, const char* argv0 = nullptr) {
  Postoffice::Get()->Start(customer_id, argv0, false);
}
/* Leaves the cluster (see postoffice.h); with do_barrier, after a barrier
 * over the servers and workers. */
inline void Finalize(int customer_id, const bool do_barrier = true) {
  Postoffice::Get()->Finalize(customer_id, do_barrier);
}
/* cb runs after Finalize has finalized the node. */
inline void RegisterExitCallback(const std::function<void()>& cb) { Postoffice::Get()->RegisterExitCallback(cb); }

}  // namespace ps
#endif  // PS_PS_H_
