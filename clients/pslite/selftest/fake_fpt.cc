// fake_fpt: a stand-in for libfpt's node and customer calls (fpt.h v2),
// for checking include/ps/ without a cluster: one process is worker 0
// (node 9) of a cluster of one server (node 8) and one worker, and a
// message to node 8 is delivered in-process to customer (app, app), one to
// node 9 to (app, customer), each customer on a thread of its own in
// order, as libfpt does. Only what selftest.cc needs; not a library.
#include <fpt.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

struct Msg {
  fpt_msg_meta meta;
  std::vector<std::string> segs;
};

struct Cust {
  fpt_msg_handler h = nullptr;
  fpt_msg_keep_handler kh = nullptr;
  void* user;
  std::deque<Msg> q;
  bool stop = false;
  std::thread t;
};

thread_local std::string last_error;
int barriers = 0, finalizes = 0;
std::mutex mu;
std::condition_variable cv;
std::map<std::pair<int, int>, Cust*> custs;
std::map<std::pair<int, int>, std::deque<Msg>> early;
// The blocks handed to keeping handlers and not released: start, bytes.
std::map<const char*, size_t> blocks;

void Loop(Cust* c) {
  std::unique_lock<std::mutex> lk(mu);
  for (;;) {
    cv.wait(lk, [c] { return c->stop || !c->q.empty(); });
    if (c->q.empty()) return;
    Msg m = c->q.front();
    c->q.pop_front();
    lk.unlock();
    std::vector<fpt_segment> segs;
    last_error = m.segs.empty() && (m.meta.flags & FPT_MSG_FAILED) ? "node 10 died (fake)" : "";
    if (c->kh && !(m.meta.flags & FPT_MSG_FAILED)) {
      // One block, laid out as libfpt's: 48 bytes of header, then the
      // segments end to end.
      size_t total = 48;
      for (auto& s : m.segs) total += s.size();
      char* block = static_cast<char*>(std::malloc(total));
      size_t off = 48;
      for (auto& s : m.segs) {
        std::memcpy(block + off, s.data(), s.size());
        segs.push_back(fpt_segment{block + off, s.size()});
        off += s.size();
      }
      {
        std::lock_guard<std::mutex> blk(mu);
        blocks[block] = total;
      }
      c->kh(&m.meta, segs.data(), segs.size(), block, c->user);
    } else if (c->kh) {
      c->kh(&m.meta, segs.data(), segs.size(), nullptr, c->user);
    } else {
      for (auto& s : m.segs) segs.push_back(fpt_segment{s.data(), s.size()});
      c->h(&m.meta, segs.data(), segs.size(), c->user);
    }
    lk.lock();
  }
}

}  // namespace

extern "C" {
const char* fpt_last_error(void) { return last_error.c_str(); }

const char* fpt_status_name(int status) { return status == FPT_OK ? "FPT_OK" : "FPT_ERR (fake_fpt)"; }

// The cluster fails: every customer's handler gets FPT_MSG_FAILED.
void fake_fpt_fail(void) {
  std::lock_guard<std::mutex> lk(mu);
  for (auto& c : custs) {
    Msg m;
    std::memset(&m.meta, 0, sizeof m.meta);
    m.meta.flags = FPT_MSG_FAILED;
    c.second->q.push_back(m);
  }
  cv.notify_all();
}
int fpt_start(void) { return FPT_OK; }
int fpt_start_customer(int) { return FPT_OK; }
int fpt_finalize(void) {
  std::vector<Cust*> all;
  {
    std::lock_guard<std::mutex> lk(mu);
    finalizes++;
    for (auto& c : custs) {
      c.second->stop = true;
      all.push_back(c.second);
    }
    custs.clear();
    cv.notify_all();
  }
  for (Cust* c : all) {
    c->t.join();
    delete c;
  }
  return FPT_OK;
}
int fpt_role(int* role) {
  *role = FPT_ROLE_WORKER;
  return FPT_OK;
}
int fpt_rank(int* rank) {
  *rank = 0;
  return FPT_OK;
}
int fpt_num_workers(int* n) {
  *n = 1;
  return FPT_OK;
}
int fpt_num_servers(int* n) {
  *n = 1;
  return FPT_OK;
}
int fpt_my_id(int* id) {
  *id = 9;
  return FPT_OK;
}
int fpt_group_ids(int g, int* ids, size_t cap, size_t* n) {
  std::vector<int> v;
  if (g >= 8) v.push_back(g);
  else {
    if (g & FPT_GROUP_SCHEDULER) v.push_back(1);
    if (g & FPT_GROUP_SERVERS) v.push_back(8);
    if (g & FPT_GROUP_WORKERS) v.push_back(9);
  }
  *n = v.size();
  for (size_t i = 0; i < v.size() && i < cap; i++) ids[i] = v[i];
  return FPT_OK;
}
int fpt_barrier_group(int) {
  std::lock_guard<std::mutex> lk(mu);
  barriers++;
  return FPT_OK;
}
// How many node barriers and finalizes ran.
int fake_fpt_barriers(void) {
  std::lock_guard<std::mutex> lk(mu);
  return barriers;
}
int fake_fpt_finalizes(void) {
  std::lock_guard<std::mutex> lk(mu);
  return finalizes;
}
// Whether p lies in a block handed to a keeping handler and not released.
int fake_fpt_in_block(const void* p) {
  std::lock_guard<std::mutex> lk(mu);
  const char* q = static_cast<const char*>(p);
  auto it = blocks.upper_bound(q);
  if (it == blocks.begin()) return 0;
  --it;
  return q < it->first + it->second;
}
// How many blocks are not released.
int fake_fpt_blocks(void) {
  std::lock_guard<std::mutex> lk(mu);
  return static_cast<int>(blocks.size());
}
void fpt_msg_release(void* block) {
  {
    std::lock_guard<std::mutex> lk(mu);
    if (!blocks.erase(static_cast<const char*>(block))) std::abort();  // not ours, or twice
  }
  std::free(block);
}
static int AddCustomer(int app, int cid, fpt_msg_handler h, fpt_msg_keep_handler kh, void* user) {
  std::lock_guard<std::mutex> lk(mu);
  if (custs.count({app, cid})) return FPT_ERR_ARG;
  Cust* c = new Cust();
  c->h = h;
  c->kh = kh;
  c->user = user;
  for (auto& m : early[{app, cid}]) c->q.push_back(m);
  early.erase({app, cid});
  custs[{app, cid}] = c;
  c->t = std::thread(Loop, c);
  cv.notify_all();
  return FPT_OK;
}
int fpt_customer_add(int app, int cid, fpt_msg_handler h, void* user) {
  return AddCustomer(app, cid, h, nullptr, user);
}
int fpt_customer_add_keep(int app, int cid, fpt_msg_keep_handler h, void* user) {
  return AddCustomer(app, cid, nullptr, h, user);
}
int fpt_customer_remove(int app, int cid) {
  Cust* c;
  {
    std::lock_guard<std::mutex> lk(mu);
    auto it = custs.find({app, cid});
    if (it == custs.end()) return FPT_ERR_ARG;
    c = it->second;
    custs.erase(it);
    c->stop = true;
    c->q.clear();
    cv.notify_all();
  }
  c->t.join();
  delete c;
  return FPT_OK;
}
int fpt_msg_send(const fpt_msg_meta* meta, const fpt_segment* segs, size_t n) {
  if (meta->recipient != 8 && meta->recipient != 9) return FPT_ERR_ARG;
  if (n > FPT_MSG_MAX_SEGMENTS) return FPT_ERR_ARG;
  Msg m;
  m.meta = *meta;
  m.meta.sender = 9;
  for (size_t i = 0; i < n; i++) m.segs.emplace_back(static_cast<const char*>(segs[i].data), segs[i].bytes);
  std::pair<int, int> to = meta->recipient == 8 ? std::make_pair(meta->app_id, meta->app_id)
                                                 : std::make_pair(meta->app_id, meta->customer_id);
  std::lock_guard<std::mutex> lk(mu);
  auto it = custs.find(to);
  if (it == custs.end()) early[to].push_back(m);
  else it->second->q.push_back(m);
  cv.notify_all();
  return FPT_OK;
}
// The tensor calls are not exercised here.
int fpt_declare(uint64_t, uint64_t, int, int) { return FPT_OK; }
int fpt_push(const uint64_t*, size_t, const void*, const uint64_t*, int, fpt_callback, void*, int64_t*) {
  return FPT_ERR_STATE;
}
int fpt_pull(const uint64_t*, size_t, void*, const uint64_t*, fpt_callback, void*, int64_t*) { return FPT_ERR_STATE; }
}
