/*
 * ps/internal/postoffice.h - ps::Postoffice, the process's node: its role,
 * the groups, the customers, barriers, start and finalize; and ps::Van,
 * which sends a Message. Both are over fpt.h.
 *
 * How ps-lite's life cycle maps onto libfpt (one node per process):
 *
 *  - Start(customer_id) / StartAsync: every call runs
 *    fpt_start_customer(customer_id). The first starts the node (it
 *    returns, on a server or worker, once every node has joined: that is
 *    ps-lite's start barrier; the scheduler's returns at once). As in
 *    ps-lite, each further customer of a worker process that starts while
 *    the cluster assembles registers with the scheduler and counts as one
 *    of DMLC_NUM_WORKER workers (the process keeps one id and one rank);
 *    its call returns once the cluster has started. On a server or the
 *    scheduler a further call waits for the start. The customers
 *    constructed before the start are registered with libfpt then.
 *  - Finalize(customer_id, do_barrier): ps-lite stops the node from
 *    customer 0's call. Here the node is finalized by customer 0's call if
 *    customer 0 started, else by the last started customer to finalize;
 *    that call first waits for every other customer that started to call
 *    Finalize, then (do_barrier) runs a barrier over the servers and
 *    workers, then fpt_finalize, then the exit callback. The other
 *    customers' calls return at once. Every started customer must call it.
 *  - Barrier(customer_id, group): fpt_barrier_group. The scheduler takes
 *    part in no barrier (fpt has no data plane on the scheduler): on the
 *    scheduler it returns at once. With several started customers in a
 *    process, each calls Barrier and the last to arrive runs the node's
 *    barrier for all (so every started customer must call it; a customer
 *    that has not called Start yet is not waited for).
 *
 * Messages to and from the scheduler's customers travel over fpt's control
 * plane (the scheduler has no data plane): at most 32 MiB each.
 */
#ifndef PS_INTERNAL_POSTOFFICE_H_
#define PS_INTERNAL_POSTOFFICE_H_

#include <fpt.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ps/base.h"
#include "ps/internal/customer.h"
#include "ps/internal/env.h"
#include "ps/internal/message.h"
#include "ps/range.h"

namespace ps {

/* The name of an fpt_status. */
inline const char* FptStatusName(int status) { return fpt_status_name(status); }

/* Ends the program unless status is FPT_OK, naming the call and libfpt's
 * reason. */
#define PS_FPT_CHECK(call, what)                                                                          \
  do {                                                                                                    \
    int _ps_fpt_status = (call);                                                                          \
    if (_ps_fpt_status != FPT_OK) {                                                                       \
      LOG(FATAL) << what << ": " << ::ps::FptStatusName(_ps_fpt_status) << ": " << fpt_last_error();     \
    }                                                                                                     \
  } while (0)

/* Sends Messages (ps-lite's Van, reduced to what programs call). */
class Van {
 public:
  /* Sends msg to msg.meta.recver; returns the bytes of data sent. */
  int Send(const Message& msg);
};

class Postoffice {
 public:
  /* The process's one Postoffice. Never destroyed: libfpt's threads may
   * run handlers while the process exits. */
  static Postoffice* Get() {
    static Postoffice* po = new Postoffice();
    return po;
  }

  Van* van() { return &van_; }

  void Start(int customer_id, const char* argv0, const bool do_barrier);
  void Finalize(const int customer_id, const bool do_barrier = true);

  void AddCustomer(Customer* customer);
  /* Registers a closed customer with libfpt once the node has started
   * (at once if it has). */
  void OpenCustomer(Customer* customer);
  void RemoveCustomer(Customer* customer);
  /* The customer (app_id, customer_id) of this process, waiting up to
   * timeout seconds for it to be constructed; nullptr if there is none. */
  Customer* GetCustomer(int app_id, int customer_id, int timeout = 0) const;

  /* The ids of the nodes of a group (or of one node), ascending. */
  const std::vector<int>& GetNodeIDs(int node_id);
  /* Server r holds keys [kMaxKey/n*r, kMaxKey/n*(r+1)), as in ps-lite. */
  const std::vector<Range>& GetServerKeyRanges();

  using Callback = std::function<void()>;
  /* Runs cb after Finalize has finalized the node. */
  void RegisterExitCallback(const Callback& cb) {
    std::lock_guard<std::mutex> lk(mu_);
    exit_callback_ = cb;
  }

  static inline int WorkerRankToID(int rank) { return rank * 2 + 9; }
  static inline int ServerRankToID(int rank) { return rank * 2 + 8; }
  static inline int IDtoRank(int id) { return std::max((id - 8) / 2, 0); }

  /* The role and the sizes are known before Start (from DMLC_*). */
  int num_workers() const {
    std::lock_guard<std::mutex> lk(role_mu_);
    if (num_workers_ < 0) PS_FPT_CHECK(fpt_num_workers(&num_workers_), "ps::NumWorkers: fpt_num_workers");
    return num_workers_;
  }
  int num_servers() const {
    std::lock_guard<std::mutex> lk(role_mu_);
    if (num_servers_ < 0) PS_FPT_CHECK(fpt_num_servers(&num_servers_), "ps::NumServers: fpt_num_servers");
    return num_servers_;
  }
  int my_rank() const {
    CHECK(started()) << "ps::MyRank before ps::Start";
    int r = 0;
    PS_FPT_CHECK(fpt_rank(&r), "ps::MyRank: fpt_rank");
    return r;
  }
  /* This node's id (1 for the scheduler, 8+2r a server, 9+2r a worker). */
  int my_id() const {
    CHECK(started()) << "ps::Postoffice::my_id before ps::Start";
    int id = 0;
    PS_FPT_CHECK(fpt_my_id(&id), "ps::Postoffice::my_id: fpt_my_id");
    return id;
  }
  int is_worker() const { return role() == FPT_ROLE_WORKER; }
  int is_server() const { return role() == FPT_ROLE_SERVER; }
  int is_scheduler() const { return role() == FPT_ROLE_SCHEDULER; }
  int verbose() const { return GetEnv("PS_VERBOSE", 0); }
  /* fpt does not restart nodes. */
  bool is_recovery() const { return false; }

  void Barrier(int customer_id, int node_group);

  /* ps-lite's nodes without a heartbeat for t seconds. fpt watches the
   * heartbeats itself and fails the cluster (every Wait ends the program)
   * when a node dies, so no node is ever reported dead here. */
  std::vector<int> GetDeadNodes(int t = 60) {
    (void)t;
    return std::vector<int>();
  }

  /* fpt: whether Start has started the node, Finalize begun to finalize it. */
  bool started() const {
    std::lock_guard<std::mutex> lk(mu_);
    return node_started_;
  }
  bool finalizing() const {
    std::lock_guard<std::mutex> lk(mu_);
    return finalizing_;
  }
  /* fpt: a check failure unless the node is started and not finalized
   * (what: the call, for the message). Messages may still be sent while
   * Finalize waits in its barrier or in fpt_finalize: a server that called
   * Finalize right after Start answers requests until the workers leave. */
  void CheckRunning(const char* what) const {
    std::lock_guard<std::mutex> lk(mu_);
    CHECK(node_started_) << what << " before ps::Start";
    CHECK(!finalized_) << what << " after ps::Finalize";
  }
  /* fpt: libfpt reported the cluster failed (on a handler or callback
   * thread): the program ends with the reason, unless Finalize is under
   * way, whose fpt_finalize returns the failure itself. */
  void ClusterFailed(const std::string& where, const std::string& reason) {
    if (finalizing()) {
      LOG(WARNING) << where << ": the cluster failed while finalizing: " << reason;
      return;
    }
    LOG(FATAL) << where << ": the cluster failed: " << reason;
  }

 private:
  Postoffice() {}
  /* The role, read once (it stays readable after Finalize). */
  int role() const {
    std::lock_guard<std::mutex> lk(role_mu_);
    if (role_ == 0) PS_FPT_CHECK(fpt_role(&role_), "ps::Postoffice: fpt_role (is DMLC_ROLE set?)");
    return role_;
  }
  /* The role and sizes, read once: they do not change, and KVWorker asks
   * for the number of servers at every response. */
  mutable std::mutex role_mu_;
  mutable int role_ = 0;
  mutable int num_workers_ = -1;
  mutable int num_servers_ = -1;
  void NodeBarrier(int customer_id, int node_group);
  void Register(Customer* c) {
    PS_FPT_CHECK(fpt_customer_add_keep(c->app_id(), c->customer_id(), &Customer::Handler, c),
                 "ps::Customer(" << c->app_id() << ", " << c->customer_id() << "): fpt_customer_add_keep");
  }

  Van van_;
  mutable std::mutex mu_;
  std::condition_variable cond_;
  bool node_started_ = false;
  bool finalizing_ = false;
  bool finalized_ = false;
  /* Customers that called Start and not yet Finalize; those in Start. */
  std::set<int> active_;
  std::set<int> starting_;
  bool zero_started_ = false;
  /* app_id -> customer_id -> customer. */
  std::unordered_map<int, std::unordered_map<int, Customer*>> customers_;
  std::mutex barrier_mu_;
  /* A barrier of several customers: how many arrived, its group, and the
   * number of barriers completed. */
  size_t barrier_arrived_ = 0;
  int barrier_group_ = 0;
  uint64_t barrier_gen_ = 0;
  std::mutex groups_mu_;
  std::unordered_map<int, std::vector<int>> node_ids_;
  std::vector<Range> server_key_ranges_;
  Callback exit_callback_;

  Postoffice(const Postoffice&) = delete;
  Postoffice& operator=(const Postoffice&) = delete;
};

#define PS_VLOG(x) LOG_IF(INFO, x <= ::ps::Postoffice::Get()->verbose())

////////////////////////////////////////////////////////////////////////////

inline void Postoffice::Start(int customer_id, const char* /*argv0*/, const bool /*do_barrier*/) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    CHECK(!finalizing_) << "ps::Start(" << customer_id
                        << ") after ps::Finalize: fpt runs one node per process, once";
    CHECK(!active_.count(customer_id) && !starting_.count(customer_id)) << "ps::Start(" << customer_id << ") twice";
    starting_.insert(customer_id);
  }
  // ps-lite's start and its barrier (a server or worker returns once every
  // node, every worker customer included, has joined).
  PS_FPT_CHECK(fpt_start_customer(customer_id), "ps::Start(" << customer_id << "): fpt_start_customer");
  std::lock_guard<std::mutex> lk(mu_);
  starting_.erase(customer_id);
  active_.insert(customer_id);
  if (customer_id == 0) zero_started_ = true;
  if (node_started_) return;
  node_started_ = true;
  for (auto& app : customers_) {
    for (auto& c : app.second) {
      if (c.second->open_) Register(c.second);
    }
  }
}

inline void Postoffice::Finalize(const int customer_id, const bool do_barrier) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    CHECK(node_started_) << "ps::Finalize(" << customer_id << ") before ps::Start";
    CHECK(active_.count(customer_id)) << "ps::Finalize(" << customer_id
                                      << ") of a customer that did not call ps::Start, or finalized already";
    active_.erase(customer_id);
    bool finalizer = customer_id == 0 || (!zero_started_ && active_.empty());
    if (!finalizer) {
      cond_.notify_all();
      return;
    }
    cond_.wait(lk, [this] { return active_.empty(); });
    finalizing_ = true;
  }
  if (do_barrier) Barrier(customer_id, kWorkerGroup + kServerGroup + kScheduler);
  PS_FPT_CHECK(fpt_finalize(), "ps::Finalize: fpt_finalize");
  Callback cb;
  {
    std::lock_guard<std::mutex> lk(mu_);
    finalized_ = true;
    cb = exit_callback_;
  }
  if (cb) cb();
}

inline void Postoffice::AddCustomer(Customer* customer) {
  std::lock_guard<std::mutex> lk(mu_);
  CHECK_NOTNULL(customer);
  int app_id = customer->app_id(), customer_id = customer->customer_id();
  CHECK_EQ(customers_[app_id].count(customer_id), 0u)
      << "customer (" << app_id << ", " << customer_id << ") already exists";
  CHECK(!finalizing_) << "ps::Customer(" << app_id << ", " << customer_id << ") constructed after ps::Finalize";
  customers_[app_id][customer_id] = customer;
  if (node_started_ && customer->open_) Register(customer);
}

inline void Postoffice::OpenCustomer(Customer* customer) {
  std::lock_guard<std::mutex> lk(mu_);
  if (customer->open_) return;
  customer->open_ = true;
  if (node_started_ && !finalizing_) Register(customer);
}

inline void Postoffice::RemoveCustomer(Customer* customer) {
  std::lock_guard<std::mutex> lk(mu_);
  int app_id = customer->app_id(), customer_id = customer->customer_id();
  auto it = customers_.find(app_id);
  if (it == customers_.end() || !it->second.count(customer_id)) return;
  it->second.erase(customer_id);
  if (it->second.empty()) customers_.erase(it);
  // After fpt_finalize the library holds no customer (and runs no handler);
  // a closed one it never held.
  if (node_started_ && !finalized_ && customer->open_) {
    int st = fpt_customer_remove(app_id, customer_id);
    if (st != FPT_OK && !finalizing_) {
      LOG(WARNING) << "ps::Customer(" << app_id << ", " << customer_id
                   << "): fpt_customer_remove: " << FptStatusName(st) << ": " << fpt_last_error();
    }
  }
}

inline Customer* Postoffice::GetCustomer(int app_id, int customer_id, int timeout) const {
  std::unique_lock<std::mutex> lk(mu_);
  auto find = [&]() -> Customer* {
    auto it = customers_.find(app_id);
    if (it == customers_.end()) return nullptr;
    auto c = it->second.find(customer_id);
    return c == it->second.end() ? nullptr : c->second;
  };
  for (int i = 0; i < timeout * 1000; ++i) {
    if (Customer* c = find()) return c;
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    lk.lock();
  }
  return find();
}

inline const std::vector<int>& Postoffice::GetNodeIDs(int node_id) {
  CHECK(started()) << "ps::Postoffice::GetNodeIDs(" << node_id << ") before ps::Start";
  std::lock_guard<std::mutex> lk(groups_mu_);
  auto it = node_ids_.find(node_id);
  if (it != node_ids_.end()) return it->second;
  std::vector<int> ids(16);
  size_t n = 0;
  PS_FPT_CHECK(fpt_group_ids(node_id, ids.data(), ids.size(), &n),
               "ps::Postoffice::GetNodeIDs: node " << node_id << " doesn't exist: fpt_group_ids");
  if (n > ids.size()) {
    ids.resize(n);
    PS_FPT_CHECK(fpt_group_ids(node_id, ids.data(), ids.size(), &n), "ps::Postoffice::GetNodeIDs: fpt_group_ids");
  }
  ids.resize(n);
  return node_ids_[node_id] = ids;
}

inline const std::vector<Range>& Postoffice::GetServerKeyRanges() {
  std::lock_guard<std::mutex> lk(groups_mu_);
  if (server_key_ranges_.empty()) {
    int n = num_servers();
    CHECK_GT(n, 0) << "ps::Postoffice::GetServerKeyRanges: no servers";
    for (int i = 0; i < n; ++i) {
      server_key_ranges_.push_back(Range(kMaxKey / n * i, kMaxKey / n * (i + 1)));
    }
  }
  return server_key_ranges_;
}

inline void Postoffice::Barrier(int customer_id, int node_group) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    CHECK(node_started_) << "ps::Postoffice::Barrier(" << customer_id << ", " << node_group
                         << ") before ps::Start";
    CHECK(!finalized_) << "ps::Postoffice::Barrier(" << customer_id << ", " << node_group
                       << ") after ps::Finalize";
  }
  int r = role();
  // The scheduler takes part in no barrier on fpt.
  if (r == FPT_ROLE_SCHEDULER) return;
  if (r == FPT_ROLE_WORKER) {
    CHECK(node_group & kWorkerGroup) << "ps::Postoffice::Barrier: a worker in a barrier of group " << node_group
                                     << ", which has no workers";
  } else {
    CHECK(node_group & kServerGroup) << "ps::Postoffice::Barrier: a server in a barrier of group " << node_group
                                     << ", which has no servers";
  }
  std::unique_lock<std::mutex> lk(mu_);
  if (active_.count(customer_id) && active_.size() > 1) {
    // Several customers of this process: the last to arrive runs the
    // node's barrier for all of them.
    if (barrier_arrived_ == 0) {
      barrier_group_ = node_group;
    } else {
      CHECK_EQ(barrier_group_, node_group) << "ps::Postoffice::Barrier: customers of one process in barriers of "
                                              "different groups at once";
    }
    uint64_t gen = barrier_gen_;
    if (++barrier_arrived_ < active_.size()) {
      cond_.wait(lk, [this, gen] { return barrier_gen_ != gen; });
      return;
    }
    lk.unlock();
    NodeBarrier(customer_id, node_group);
    lk.lock();
    barrier_arrived_ = 0;
    barrier_gen_++;
    cond_.notify_all();
    return;
  }
  lk.unlock();
  NodeBarrier(customer_id, node_group);
}

inline void Postoffice::NodeBarrier(int customer_id, int node_group) {
  std::lock_guard<std::mutex> lk(barrier_mu_);
  PS_FPT_CHECK(fpt_barrier_group(node_group), "ps::Postoffice::Barrier(" << customer_id << ", " << node_group
                                                                          << "): fpt_barrier_group");
}

////////////////////////////////////////////////////////////////////////////

inline int Van::Send(const Message& msg) {
  Postoffice* po = Postoffice::Get();
  po->CheckRunning("sending a message");
  const Meta& m = msg.meta;
  fpt_msg_meta meta;
  std::memset(&meta, 0, sizeof meta);
  meta.app_id = m.app_id;
  meta.customer_id = m.customer_id;
  meta.timestamp = m.timestamp;
  meta.head = m.head;
  meta.recipient = m.recver;
  meta.flags = (m.request ? FPT_MSG_REQUEST : 0u) | (m.push ? FPT_MSG_PUSH : 0u) | (m.pull ? FPT_MSG_PULL : 0u) |
               (m.simple_app ? FPT_MSG_SIMPLE : 0u);
  meta.dtype = m.dtype;
  meta.priority = m.priority;
  static const char empty = 0;
  fpt_segment segs[FPT_MSG_MAX_SEGMENTS];
  size_t n = 0;
  uint64_t bytes = 0;
  if (m.simple_app) {
    CHECK(msg.data.empty()) << "a SimpleApp message carries its body only";
    segs[n].data = m.body.empty() ? &empty : m.body.data();
    segs[n].bytes = m.body.size();
    bytes += m.body.size();
    n++;
  } else {
    CHECK_LE(msg.data.size(), static_cast<size_t>(FPT_MSG_MAX_SEGMENTS))
        << "a message of " << msg.data.size() << " data segments";
    for (const SArray<char>& d : msg.data) {
      segs[n].data = d.empty() ? &empty : d.data();
      segs[n].bytes = d.size();
      bytes += d.size();
      n++;
    }
  }
  PS_FPT_CHECK(fpt_msg_send(&meta, segs, n), "sending a message of " << bytes << " bytes to node " << m.recver
                                                                     << " (app " << m.app_id << ", customer "
                                                                     << m.customer_id << "): fpt_msg_send");
  return static_cast<int>(std::min<uint64_t>(bytes, 0x7fffffff));
}

////////////////////////////////////////////////////////////////////////////
// Customer

inline Customer::Customer(int app_id, int customer_id, const RecvHandle& recv_handle, bool open)
    : app_id_(app_id), customer_id_(customer_id), recv_handle_(recv_handle), open_(open) {
  Postoffice::Get()->AddCustomer(this);
}

inline void Customer::Open() { Postoffice::Get()->OpenCustomer(this); }

inline Customer::~Customer() { Postoffice::Get()->RemoveCustomer(this); }

inline int Customer::NewRequest(int recver) {
  int num = static_cast<int>(Postoffice::Get()->GetNodeIDs(recver).size());
  return NewRequestCount(num);
}

inline int Customer::NewRequestCount(int num) {
  std::lock_guard<std::mutex> lk(tracker_mu_);
  tracker_.push_back(std::make_pair(num, 0));
  return static_cast<int>(tracker_.size() - 1);
}

inline void Customer::CheckTimestamp(int timestamp, const char* what) {
  CHECK(timestamp >= 0 && static_cast<size_t>(timestamp) < tracker_.size())
      << what << ": customer (" << app_id_ << ", " << customer_id_ << ") has no request " << timestamp;
}

inline void Customer::WaitRequest(int timestamp) {
  std::unique_lock<std::mutex> lk(tracker_mu_);
  CheckTimestamp(timestamp, "Wait");
  tracker_cond_.wait(lk, [this, timestamp] {
    return failed_ || tracker_[timestamp].first == tracker_[timestamp].second;
  });
  if (tracker_[timestamp].first != tracker_[timestamp].second) {
    LOG(FATAL) << "Wait(" << timestamp << ") of customer (" << app_id_ << ", " << customer_id_
               << "): the cluster failed: " << failure_;
  }
}

inline int Customer::NumResponse(int timestamp) {
  std::lock_guard<std::mutex> lk(tracker_mu_);
  CheckTimestamp(timestamp, "NumResponse");
  return tracker_[timestamp].second;
}

inline void Customer::AddResponse(int timestamp, int num) {
  std::lock_guard<std::mutex> lk(tracker_mu_);
  CheckTimestamp(timestamp, "a response");
  tracker_[timestamp].second += num;
  tracker_cond_.notify_all();
}

inline void Customer::Fail(const std::string& reason) {
  std::lock_guard<std::mutex> lk(tracker_mu_);
  if (!failed_) {
    failed_ = true;
    failure_ = reason;
  }
  tracker_cond_.notify_all();
}

inline void Customer::Handler(const fpt_msg_meta* meta, const fpt_segment* segs, size_t num_segs, void* block,
                              void* user_data) {
  Customer* c = static_cast<Customer*>(user_data);
  // The message's block is ours from here: every segment's SArray shares
  // it, and the last one to go releases it.
  std::shared_ptr<char> owner;
  if (block) owner.reset(static_cast<char*>(block), [](char* p) { fpt_msg_release(p); });
  if (meta->flags & FPT_MSG_FAILED) {
    std::string reason = fpt_last_error();
    c->Fail(reason);
    std::ostringstream where;
    where << "customer (" << c->app_id_ << ", " << c->customer_id_ << ")";
    Postoffice::Get()->ClusterFailed(where.str(), reason);
    return;
  }
  Message msg;
  msg.meta.app_id = meta->app_id;
  msg.meta.customer_id = meta->customer_id;
  msg.meta.timestamp = meta->timestamp;
  msg.meta.head = meta->head;
  msg.meta.sender = meta->sender;
  msg.meta.recver = meta->recipient;
  msg.meta.request = (meta->flags & FPT_MSG_REQUEST) != 0;
  msg.meta.push = (meta->flags & FPT_MSG_PUSH) != 0;
  msg.meta.pull = (meta->flags & FPT_MSG_PULL) != 0;
  msg.meta.simple_app = (meta->flags & FPT_MSG_SIMPLE) != 0;
  msg.meta.dtype = meta->dtype;
  msg.meta.priority = meta->priority;
  if (msg.meta.simple_app) {
    if (num_segs > 0 && segs[0].bytes > 0) {
      msg.meta.body.assign(static_cast<const char*>(segs[0].data), segs[0].bytes);
    }
  } else {
    for (size_t i = 0; i < num_segs; i++) {
      SArray<char> d;
      char* data = static_cast<char*>(const_cast<void*>(segs[i].data));
      // A view of the block (zero copy, as ps-lite's received SArrays
      // are), unless there is none (the segments live during this call
      // only) or the data are not aligned for any value type.
      if (owner && reinterpret_cast<uintptr_t>(data) % 8 == 0) {
        d.reset(data, segs[i].bytes, [](char*) {});
        d.ptr() = std::shared_ptr<char>(owner, data);
      } else {
        d.CopyFrom(data, segs[i].bytes);
      }
      msg.data.push_back(d);
    }
  }
  c->recv_handle_(msg);
  if (!msg.meta.request) c->AddResponse(msg.meta.timestamp);
}

}  // namespace ps
#endif  // PS_INTERNAL_POSTOFFICE_H_
