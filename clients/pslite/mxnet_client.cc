// mxnet_client: replays the ps-lite calls of MXNet's distributed kvstore
// (src/kvstore/kvstore_dist.h on the workers, kvstore_dist_server.h on the
// servers) under Gluon's sequence with update_on_kvstore, written against
// ps:: only, and checks every weight exactly against a local computation.
//
// Workers (KVStoreDist): a KVWorker<float>(0, 0) made before StartAsync,
// then a barrier of every node (the scheduler takes no part on fpt). Worker
// 0 sends kSyncMode and kController ("sgd lr=0.25", set_optimizer) to
// kServerGroup with SimpleApp::Request and waits. Each parameter's key is
// encoded as EncodeDefaultKey does: a small array goes whole to server
// (key*9973) % S, a big one (-bound elements or more) is cut into one
// slice per server; keys are offsets into the servers' key ranges. Init:
// worker 0 ZPushes every key's weights, a worker barrier, and every worker
// ZPulls them. Each iteration every worker ZPushPulls its gradient of every
// key and waits: the answer is the updated weight, which must equal
// w - lr * (sum of every worker's gradient). At the end (the destructor): a
// worker barrier, worker 0 sends kStopServer, Finalize.
//
// Servers (KVStoreDistServer): a KVServer<float>(0) made before
// StartAsync, its SimpleApp request handle taking the commands and its KV
// request handle the data. The first push of a key stores it as the
// weight (init); after that, in sync mode, the pushes of a key are merged
// until every worker's is in, then the SGD updater runs once and every
// waiting request is answered (pushpull requests with the new weight). The
// server's main thread waits for kStopServer (MXNet's executor loop),
// then calls Finalize.
//
// With -fpt 1, the optimizer runs on the workers (Gluon's
// update_on_kvstore=False) and the gradients go through FPT's path, as
// FPT-ps-lite's MXNet patch sends them: every worker FPTDeclares every
// key whole (priority: minus the layer), a worker barrier; init is each
// key's first FPTPush (only worker 0's weights count: the others push
// garbage) and FPTPull; each iteration every worker FPTPushes its
// gradients, last layer first, FPTPulls the sums and applies the SGD step
// itself. The servers still take the commands (kSyncMode, kStopServer),
// but no data request reaches them.
//
// Values are small integers and multiples of 1/4: exact in float.
//
//   mxnet_client [-iters N] [-bound ELEMS] [-fpt 0|1]

#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace {

// MXNet's CommandType and RequestType values.
enum class CommandType { kController, kSetMultiPrecision, kStopServer, kSyncMode, kSetGradientCompression };
enum RequestType { kDefaultPushPull = 0 };

// The model: parameter sizes (elements), a mix of small and big arrays.
const std::vector<size_t> kSizes = {10, 3000, 1, 2500, 700, 5001, 64};

float InitWeight(int key, size_t j) { return float(int((key * 3 + j) % 11) - 5); }
float Grad(int rank, int iter, int key, size_t j) { return float(int((rank * 5 + iter * 3 + key + j) % 9) - 4); }

// ---------------------------------------------------------------- server

class Server {
 public:
  Server() {
    ps_server_ = new ps::KVServer<float>(0);
    static_cast<ps::SimpleApp*>(ps_server_)
        ->set_request_handle([this](const ps::SimpleData& recved, ps::SimpleApp* app) { CommandHandle(recved, app); });
    ps_server_->set_request_handle(
        [this](const ps::KVMeta& meta, const ps::KVPairs<float>& data, ps::KVServer<float>* server) {
          DataHandle(meta, data, server);
        });
  }
  ~Server() { delete ps_server_; }

  // MXNet's executor loop: until kStopServer.
  void Run() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [this] { return stop_; });
  }

 private:
  struct Merge {
    std::vector<float> buf;
    std::vector<ps::KVMeta> requests;
  };

  void CommandHandle(const ps::SimpleData& recved, ps::SimpleApp* app) {
    CommandType cmd = static_cast<CommandType>(recved.head);
    if (cmd == CommandType::kSyncMode) {
      sync_mode_ = true;
    } else if (cmd == CommandType::kController) {
      // set_optimizer: "sgd lr=<x>".
      CHECK_EQ(recved.body.compare(0, 7, "sgd lr="), 0) << "optimizer " << recved.body;
      lr_ = std::strtof(recved.body.c_str() + 7, nullptr);
    } else if (cmd == CommandType::kStopServer) {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      cv_.notify_all();
    } else {
      LOG(FATAL) << "unknown command " << recved.head;
    }
    app->Response(recved);
  }

  void Respond(const ps::KVMeta& meta, ps::Key key, ps::KVServer<float>* server) {
    ps::KVPairs<float> res;
    if (meta.pull) {
      const std::vector<float>& w = store_[key];
      res.keys.push_back(key);
      res.vals.CopyFrom(w.data(), w.size());
      res.lens.push_back(static_cast<int>(w.size()));
    }
    server->Response(meta, res);
  }

  void DataHandle(const ps::KVMeta& meta, const ps::KVPairs<float>& data, ps::KVServer<float>* server) {
    CHECK_EQ(meta.cmd, kDefaultPushPull);
    CHECK_EQ(data.keys.size(), 1u) << "one key per request, as EncodeDefaultKey makes them";
    ps::Key key = data.keys[0];
    std::vector<float>& w = store_[key];
    if (!meta.push) {
      CHECK(!w.empty()) << "pull of key " << key << " before its init";
      Respond(meta, key, server);
      return;
    }
    size_t len = data.lens.empty() ? data.vals.size() : size_t(data.lens[0]);
    CHECK_EQ(len, data.vals.size());
    if (w.empty()) {
      // The init push: its values are the weight.
      w.assign(data.vals.begin(), data.vals.end());
      Respond(meta, key, server);
      return;
    }
    CHECK_EQ(len, w.size()) << "push of key " << key;
    if (!sync_mode_) {
      for (size_t j = 0; j < len; ++j) w[j] -= lr_ * data.vals[j];
      Respond(meta, key, server);
      return;
    }
    Merge& m = merge_[key];
    if (m.buf.empty()) m.buf.assign(len, 0.f);
    for (size_t j = 0; j < len; ++j) m.buf[j] += data.vals[j];
    m.requests.push_back(meta);
    if (m.requests.size() < static_cast<size_t>(ps::NumWorkers())) return;
    // Every worker's gradient is in: update once, then answer them all.
    for (size_t j = 0; j < len; ++j) w[j] -= lr_ * m.buf[j];
    for (const ps::KVMeta& r : m.requests) Respond(r, key, server);
    merge_.erase(key);
  }

  ps::KVServer<float>* ps_server_;
  bool sync_mode_ = false;
  float lr_ = 0;
  std::unordered_map<ps::Key, std::vector<float>> store_;
  std::unordered_map<ps::Key, Merge> merge_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

// ---------------------------------------------------------------- worker

struct PSKV {
  ps::SArray<ps::Key> keys;
  ps::SArray<int> lens;
  size_t size = 0;
};

// MXNet's EncodeDefaultKey.
PSKV EncodeDefaultKey(int key, size_t size, size_t bigarray_bound) {
  const std::vector<ps::Range>& krs = ps::Postoffice::Get()->GetServerKeyRanges();
  int num_servers = static_cast<int>(krs.size());
  PSKV pskv;
  pskv.size = size;
  if (size < bigarray_bound) {
    int server = (key * 9973) % num_servers;
    pskv.keys.push_back(krs[server].begin() + key);
    pskv.lens.push_back(static_cast<int>(size));
  } else {
    for (int i = 0; i < num_servers; ++i) {
      size_t part = static_cast<size_t>(std::round(double(size) / num_servers * (i + 1))) -
                    static_cast<size_t>(std::round(double(size) / num_servers * i));
      pskv.keys.push_back(krs[i].begin() + key);
      pskv.lens.push_back(static_cast<int>(part));
    }
  }
  return pskv;
}

void SendCommandToServers(ps::KVWorker<float>* w, CommandType cmd, const std::string& body) {
  w->Wait(w->Request(static_cast<int>(cmd), body, ps::kServerGroup));
}

void RunWorker(ps::KVWorker<float>* kv, int iters, size_t bound) {
  int rank = ps::MyRank(), workers = ps::NumWorkers();
  const float lr = 0.25f;
  if (rank == 0) {
    SendCommandToServers(kv, CommandType::kSyncMode, "");
    std::ostringstream opt;
    opt << "sgd lr=" << lr;
    SendCommandToServers(kv, CommandType::kController, opt.str());
  }
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);

  int num_keys = static_cast<int>(kSizes.size());
  std::vector<PSKV> pskv;
  std::vector<std::vector<float>> weight(num_keys);
  for (int k = 0; k < num_keys; ++k) {
    pskv.push_back(EncodeDefaultKey(k, kSizes[k], bound));
    for (size_t j = 0; j < kSizes[k]; ++j) weight[k].push_back(InitWeight(k, j));
  }
  // InitImpl: worker 0 pushes, a barrier, every worker pulls.
  if (rank == 0) {
    std::vector<int> ts;
    for (int k = 0; k < num_keys; ++k) {
      ps::SArray<float> vals(weight[k]);
      ts.push_back(kv->ZPush(pskv[k].keys, vals, pskv[k].lens, kDefaultPushPull));
    }
    for (int t : ts) kv->Wait(t);
  }
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  for (int k = 0; k < num_keys; ++k) {
    ps::SArray<float> vals;
    kv->Wait(kv->ZPull(pskv[k].keys, &vals, &pskv[k].lens, kDefaultPushPull));
    CHECK_EQ(vals.size(), weight[k].size());
    for (size_t j = 0; j < vals.size(); ++j) CHECK_EQ(vals[j], weight[k][j]) << "init of key " << k << " at " << j;
  }
  std::printf("worker %d: init: %d keys pulled, every weight exact\n", rank, num_keys);

  // Training: pushpull every gradient, then check the updated weights.
  for (int it = 1; it <= iters; ++it) {
    std::vector<ps::SArray<float>> outs(num_keys);
    std::vector<int> ts;
    // Backward order, last layer first, as the engine runs them.
    for (int k = num_keys - 1; k >= 0; --k) {
      std::vector<float> g(kSizes[k]);
      for (size_t j = 0; j < g.size(); ++j) g[j] = Grad(rank, it, k, j);
      ps::SArray<float> vals(g);
      outs[k].resize(kSizes[k]);
      ts.push_back(kv->ZPushPull(pskv[k].keys, vals, &outs[k], &pskv[k].lens, kDefaultPushPull, nullptr, -k));
    }
    for (int t : ts) kv->Wait(t);
    for (int k = 0; k < num_keys; ++k) {
      for (size_t j = 0; j < kSizes[k]; ++j) {
        float sum = 0;
        for (int r = 0; r < workers; ++r) sum += Grad(r, it, k, j);
        weight[k][j] -= lr * sum;
        CHECK_EQ(outs[k][j], weight[k][j]) << "iteration " << it << ": key " << k << " element " << j;
      }
    }
    std::printf("worker %d: iteration %d/%d: every weight exact\n", rank, it, iters);
    std::fflush(stdout);
  }
  // ~KVStoreDist: a barrier, worker 0 stops the servers.
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  if (rank == 0) SendCommandToServers(kv, CommandType::kStopServer, "");
  std::printf("worker %d: PASS: %d iterations x %d keys, sync SGD on the servers, every weight exact\n", rank, iters,
              num_keys);
  std::fflush(stdout);
}

// Gluon with update_on_kvstore=False over FPT's path (see the top).
void RunWorkerFPT(ps::KVWorker<float>* kv, int iters) {
  int rank = ps::MyRank(), workers = ps::NumWorkers();
  const float lr = 0.25f;
  if (rank == 0) SendCommandToServers(kv, CommandType::kSyncMode, "");
  int num_keys = static_cast<int>(kSizes.size());
  std::vector<ps::SArray<ps::Key>> keys(num_keys);
  std::vector<std::vector<float>> weight(num_keys);
  for (int k = 0; k < num_keys; ++k) {
    keys[k].push_back(ps::Key(k));
    kv->FPTDeclare(keys[k], ps::SArray<int>(1, static_cast<int>(kSizes[k])), -k);
    for (size_t j = 0; j < kSizes[k]; ++j) weight[k].push_back(InitWeight(k, j));
  }
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  // Init, one key at a time as Gluon broadcasts: worker 0's weights win.
  for (int k = 0; k < num_keys; ++k) {
    ps::SArray<float> mine(kSizes[k]);
    for (size_t j = 0; j < kSizes[k]; ++j) mine[j] = rank == 0 ? weight[k][j] : float(1000 + rank);
    kv->Wait(kv->FPTPush(keys[k], mine, {}, 0, nullptr, -k));
    ps::SArray<float> got;
    kv->Wait(kv->FPTPull(keys[k], &got));
    CHECK_EQ(got.size(), weight[k].size());
    for (size_t j = 0; j < got.size(); ++j) CHECK_EQ(got[j], weight[k][j]) << "init of key " << k << " at " << j;
  }
  std::printf("worker %d: init: %d keys through FPTPush/FPTPull, worker 0's weights everywhere\n", rank, num_keys);

  for (int it = 1; it <= iters; ++it) {
    std::vector<ps::SArray<float>> grads(num_keys), sums(num_keys);
    std::vector<int> ts;
    for (int k = num_keys - 1; k >= 0; --k) {
      grads[k].resize(kSizes[k]);
      for (size_t j = 0; j < kSizes[k]; ++j) grads[k][j] = Grad(rank, it, k, j);
      ts.push_back(kv->FPTPush(keys[k], grads[k], {}, 0, nullptr, -k));
    }
    for (int t : ts) kv->Wait(t);
    ts.clear();
    for (int k = 0; k < num_keys; ++k) {
      sums[k].resize(kSizes[k]);
      ts.push_back(kv->FPTPull(keys[k], &sums[k]));
    }
    for (int t : ts) kv->Wait(t);
    for (int k = 0; k < num_keys; ++k) {
      for (size_t j = 0; j < kSizes[k]; ++j) {
        float sum = 0;
        for (int r = 0; r < workers; ++r) sum += Grad(r, it, k, j);
        CHECK_EQ(sums[k][j], sum) << "iteration " << it << ": sum of key " << k << " element " << j;
        weight[k][j] -= lr * sums[k][j];
      }
    }
    std::printf("worker %d: iteration %d/%d: every sum exact\n", rank, it, iters);
    std::fflush(stdout);
  }
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  if (rank == 0) SendCommandToServers(kv, CommandType::kStopServer, "");
  std::printf("worker %d: PASS: %d iterations x %d keys, FPTPush/FPTPull, SGD on the workers, every value exact\n",
              rank, iters, num_keys);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char* argv[]) {
  int iters = 5;
  size_t bound = 1000;
  bool fpt = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-iters")) iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-bound")) bound = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "-fpt")) fpt = std::atoi(argv[i + 1]) != 0;
  }
  const int all = ps::kWorkerGroup + ps::kServerGroup + ps::kScheduler;
  if (ps::IsWorker()) {
    ps::KVWorker<float>* kv = new ps::KVWorker<float>(0, 0);
    ps::StartAsync(0, "mxnet\0");
    if (!ps::Postoffice::Get()->is_recovery()) ps::Postoffice::Get()->Barrier(0, all);
    if (fpt) {
      RunWorkerFPT(kv, iters);
    } else {
      RunWorker(kv, iters, bound);
    }
    ps::Finalize(0, true);
    delete kv;
    return 0;
  }
  // RunServer.
  Server* server = ps::IsServer() ? new Server() : nullptr;
  ps::StartAsync(0, "mxnet_server\0");
  if (!ps::Postoffice::Get()->is_recovery()) ps::Postoffice::Get()->Barrier(0, all);
  if (server) server->Run();
  ps::Finalize(0, true);
  delete server;
  std::printf("%s: done\n", ps::IsServer() ? "server" : "scheduler");
  return 0;
}
