// multi_workers: several worker customers in one process (as ps-lite's
// tests/test_kv_app_multi_workers.cc), written against ps:: only. Each
// worker process runs -customers threads, and, as in ps-lite, each counts
// as one of DMLC_NUM_WORKER workers: the job has DMLC_NUM_WORKER /
// customers worker processes (ranks), and NumWorkers() is
// DMLC_NUM_WORKER. Thread c calls Start(c), makes a
// KVWorker<float>(0, c) and pushes its own keys (offset by c) -repeat
// times; after a barrier of every customer of every worker, a Pull must be
// exactly the sum over the worker processes and the repeats, and, after
// another barrier, PushPull's answer one round more after the next one. Responses come
// to customer (0, c) of the right process: a mix-up shows as a wrong sum.
// Servers run a KVServer<float> with KVServerDefaultHandle; the scheduler
// only starts and finalizes. Thread c
// calls Finalize(c); customer 0's call finalizes the node once every
// customer has.
//
// -server-delay MS has a server sleep MS after Start before it makes its
// KVServer, and MS more before set_request_handle: the workers' first
// pushes come before either, as they may in any ps-lite program, and must
// wait for the handle. -no-handle has a server never set it: the node fails
// once the requests have waited FPT_START_TIMEOUT.
//
//   multi_workers [-customers C] [-keys N] [-repeat R] [-server-delay MS] [-no-handle 1]

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "ps/ps.h"

using namespace ps;

namespace {

int g_customers = 2, g_keys = 1000, g_repeat = 20, g_server_delay_ms = 0, g_no_handle = 0;

// Started is a latch: each customer waits until all have called Start,
// so that a barrier counts every customer of the process (a customer
// that has not started is not waited for).
std::mutex g_mu;
std::condition_variable g_cv;
int g_started = 0;

float Value(int rank, int customer, int i) { return float((rank * 5 + customer * 11 + i) % 17 + 1); }

void RunWorker(int customer_id) {
  Start(customer_id);
  {
    std::unique_lock<std::mutex> lk(g_mu);
    g_started++;
    g_cv.notify_all();
    g_cv.wait(lk, [] { return g_started == g_customers; });
  }
  KVWorker<float> kv(0, customer_id);
  int rank = MyRank(), workers = NumWorkers() / g_customers;
  CHECK_EQ(workers * g_customers, NumWorkers()) << "DMLC_NUM_WORKER counts every customer of every worker process";
  std::vector<Key> keys(g_keys);
  std::vector<float> vals(g_keys);
  for (int i = 0; i < g_keys; ++i) {
    keys[i] = kMaxKey / g_keys * i + customer_id;
    vals[i] = Value(rank, customer_id, i);
  }
  std::vector<int> ts;
  for (int i = 0; i < g_repeat; ++i) {
    ts.push_back(kv.Push(keys, vals));
    // Bound the requests in flight, as ps-lite's test does.
    if (i > 10) kv.Wait(ts[ts.size() - 10]);
  }
  for (int t : ts) kv.Wait(t);
  Postoffice::Get()->Barrier(customer_id, kWorkerGroup);

  std::vector<float> rets;
  kv.Wait(kv.Pull(keys, &rets));
  CHECK_EQ(rets.size(), vals.size());
  for (int i = 0; i < g_keys; ++i) {
    float want = 0;
    for (int r = 0; r < workers; ++r) want += Value(r, customer_id, i);
    CHECK_EQ(rets[i], want * g_repeat) << "customer " << customer_id << ": pull of key index " << i;
  }
  // Every worker has pulled before any PushPull adds to the values (one
  // worker's PushPull once reached a server before another's pull).
  Postoffice::Get()->Barrier(customer_id, kWorkerGroup);
  std::vector<float> outs;
  kv.Wait(kv.PushPull(keys, vals, &outs));
  Postoffice::Get()->Barrier(customer_id, kWorkerGroup);
  kv.Wait(kv.Pull(keys, &rets));
  for (int i = 0; i < g_keys; ++i) {
    float want = 0;
    for (int r = 0; r < workers; ++r) want += Value(r, customer_id, i);
    CHECK_EQ(rets[i], want * (g_repeat + 1)) << "customer " << customer_id << ": pull after pushpull, index " << i;
  }
  std::printf("worker %d customer %d: PASS: %d keys x %d pushes from %d worker processes, pulled exactly\n", rank,
              customer_id, g_keys, g_repeat, workers);
  std::fflush(stdout);
  Finalize(customer_id, true);
}

}  // namespace

int main(int argc, char* argv[]) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-customers")) g_customers = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-keys")) g_keys = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-repeat")) g_repeat = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-server-delay")) g_server_delay_ms = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-no-handle")) g_no_handle = std::atoi(argv[i + 1]);
  }
  CHECK_GT(g_customers, 0);
  if (!IsWorker()) {
    Start(0);
    KVServer<float>* server = nullptr;
    if (IsServer()) {
      auto delay = std::chrono::milliseconds(g_server_delay_ms);
      std::this_thread::sleep_for(delay);
      server = new KVServer<float>(0);
      std::this_thread::sleep_for(delay);
      if (!g_no_handle) server->set_request_handle(KVServerDefaultHandle<float>());
    }
    Finalize(0, true);
    delete server;
    std::printf("%s: done\n", IsServer() ? "server" : "scheduler");
    return 0;
  }
  std::vector<std::thread> threads;
  for (int c = 0; c < g_customers; ++c) threads.emplace_back(RunWorker, c);
  for (auto& t : threads) t.join();
  std::printf("worker: done\n");
  return 0;
}
