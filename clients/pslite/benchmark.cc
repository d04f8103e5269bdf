// benchmark: push+pull goodput of a ps-lite program on fpt (as ps-lite's
// tests/test_kv_app_benchmark.cc), written against ps:: only. Each worker
// pushes -bytes of float values over -keys keys (spread over every
// server's key range) and pulls them back, -iters times, timing the
// communication; servers run KVServerDefaultHandle (-handle default) or
// the program's own store of one vector per key (-handle vector, for
// ps-lite's default handle, which keeps one value per key). After a
// worker barrier, a final pull must be exactly the sum of every worker's
// pushes. Prints "PASS: ... goodput G Gbit/s" (bytes pushed and pulled over
// the time spent) and a line "bench: {...}" (JSON: rank, push_s and pull_s
// over the timed iterations, moved_bytes pushed and pulled in all,
// untimed ones included) for fpt bench. The scheduler only starts and
// finalizes.
//
// With -mode fpt the workers use FPTPush/FPTPull instead (fpt's own
// aggregation; the servers' handler sees nothing): every key declared, one
// untimed init round, then -iters timed rounds whose every pulled sum is
// checked exactly. Built against dmlc/ps-lite (no fpt.h) only -mode
// classic exists.
//
//   benchmark [-bytes B] [-keys N] [-iters I] [-mode classic|fpt] [-handle default|vector]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

using namespace ps;

namespace {

float Value(int rank, size_t i) { return float((rank * 3 + i) % 7 + 1); }

// ElemsPerKey is the float values each of num_keys keys gets of bytes.
size_t ElemsPerKey(size_t bytes, int num_keys) {
  size_t per_key = bytes / sizeof(float) / num_keys;
  CHECK_GT(per_key, 0u) << "-bytes too small for -keys";
  return per_key;
}

// Values is this worker's push: per_key values for each of num_keys keys.
SArray<float> Values(size_t per_key, int num_keys) {
  SArray<float> vals(per_key * num_keys);
  int rank = MyRank();
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = Value(rank, i);
  return vals;
}

// VectorHandle keeps one vector per key, every key of a request the same
// length (vals / keys): what KVServerDefaultHandle does on fpt, for a
// ps-lite whose default handle keeps one value per key.
struct VectorHandle {
  void operator()(const KVMeta& req_meta, const KVPairs<float>& req_data, KVServer<float>* server) {
    size_t n = req_data.keys.size();
    size_t k = n ? req_data.vals.size() / n : 0;
    KVPairs<float> res;
    if (req_meta.push) {
      for (size_t i = 0; i < n; ++i) {
        std::vector<float>& v = store[req_data.keys[i]];
        if (v.empty()) v.resize(k);
        CHECK_EQ(v.size(), k);
        const float* src = req_data.vals.data() + i * k;
        for (size_t j = 0; j < k; ++j) v[j] += src[j];
      }
    }
    if (req_meta.pull) {
      res.keys = req_data.keys;
      size_t len = n ? store[req_data.keys[0]].size() : 0;
      res.vals.resize(n * len);
      for (size_t i = 0; i < n; ++i) {
        const std::vector<float>& v = store[req_data.keys[i]];
        CHECK_EQ(v.size(), len);
        std::memcpy(res.vals.data() + i * len, v.data(), len * sizeof(float));
      }
    }
    server->Response(req_meta, res);
  }
  std::unordered_map<Key, std::vector<float>> store;
};

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Report(int rank, double push_s, double pull_s, double moved_bytes) {
  std::printf("bench: {\"rank\":%d,\"push_s\":%.6f,\"pull_s\":%.6f,\"moved_bytes\":%.0f}\n", rank, push_s, pull_s,
              moved_bytes);
  std::fflush(stdout);
}

void RunWorker(size_t bytes, int num_keys, int iters) {
  int rank = MyRank(), workers = NumWorkers();
  size_t per_key = ElemsPerKey(bytes, num_keys);
  KVWorker<float> kv(0, 0);
  SArray<Key> keys(num_keys);
  for (int i = 0; i < num_keys; ++i) keys[i] = kMaxKey / num_keys * i;
  SArray<float> vals = Values(per_key, num_keys);
  SArray<float> outs;
  double push_s = 0, pull_s = 0;
  for (int it = 0; it < iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    kv.Wait(kv.ZPush(keys, vals));
    push_s += Since(t0);
    t0 = std::chrono::steady_clock::now();
    kv.Wait(kv.ZPull(keys, &outs));
    pull_s += Since(t0);
  }
  Postoffice::Get()->Barrier(0, kWorkerGroup);
  kv.Wait(kv.ZPull(keys, &outs));
  CHECK_EQ(outs.size(), vals.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    float want = 0;
    for (int r = 0; r < workers; ++r) want += Value(r, i);
    CHECK_EQ(outs[i], want * iters) << "value " << i;
  }
  double seconds = push_s + pull_s;
  double size = double(vals.size() * sizeof(float));
  double total = 2.0 * size * iters;
  std::printf("worker %d: PASS: %d iterations of %.1f MiB over %d keys pushed and pulled, exact; goodput %.3f Gbit/s\n",
              rank, iters, size / (1 << 20), num_keys, seconds > 0 ? total * 8 / seconds / 1e9 : 0.0);
  Report(rank, push_s, pull_s, size * (2 * iters + 1));
}

#ifdef FPT_H
void RunWorkerFPT(size_t bytes, int num_keys, int iters) {
  int rank = MyRank(), workers = NumWorkers();
  size_t per_key = ElemsPerKey(bytes, num_keys);
  KVWorker<float> kv(0, 0);
  SArray<Key> keys(num_keys);
  for (int i = 0; i < num_keys; ++i) keys[i] = Key(i);
  kv.FPTDeclare(keys, SArray<int>(num_keys, static_cast<int>(per_key)));
  Postoffice::Get()->Barrier(0, kWorkerGroup);
  SArray<float> vals = Values(per_key, num_keys);
  SArray<float> outs(vals.size());
  kv.Wait(kv.FPTPush(keys, vals));  // the init round: worker 0's values
  kv.Wait(kv.FPTPull(keys, &outs));
  double push_s = 0, pull_s = 0;
  for (int it = 0; it < iters; ++it) {
    // A push and its pull overlap on this path: the pull's wait is the
    // pair's time, counted as the pull's.
    auto t0 = std::chrono::steady_clock::now();
    int push = kv.FPTPush(keys, vals);
    kv.Wait(kv.FPTPull(keys, &outs));
    kv.Wait(push);
    pull_s += Since(t0);
    for (size_t i = 0; i < outs.size(); ++i) {
      float want = 0;
      for (int r = 0; r < workers; ++r) want += Value(r, i);
      CHECK_EQ(outs[i], want) << "iteration " << it << " value " << i;
    }
  }
  double size = double(vals.size() * sizeof(float));
  double total = 2.0 * size * iters;
  std::printf("worker %d: PASS: FPTPush/FPTPull: %d iterations of %.1f MiB over %d keys, exact; goodput %.3f Gbit/s\n",
              rank, iters, size / (1 << 20), num_keys, pull_s > 0 ? total * 8 / pull_s / 1e9 : 0.0);
  Report(rank, push_s, pull_s, size * 2 * (iters + 1));
}
#endif

}  // namespace

int main(int argc, char* argv[]) {
  size_t bytes = 4 << 20;
  int num_keys = 16, iters = 10;
  std::string mode = "classic", handle = "default";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-bytes")) bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "-keys")) num_keys = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-iters")) iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-mode")) mode = argv[i + 1];
    else if (!std::strcmp(argv[i], "-handle")) handle = argv[i + 1];
  }
  CHECK_GT(num_keys, 0);
  CHECK_GT(iters, 0);
#ifdef FPT_H
  CHECK(mode == "classic" || mode == "fpt") << "-mode " << mode << ": want classic or fpt";
#else
  CHECK(mode == "classic") << "-mode " << mode << ": want classic (built against ps-lite)";
#endif
  CHECK(handle == "default" || handle == "vector") << "-handle " << handle << ": want default or vector";
  // After Start, as ps-lite's own programs do (ps-lite registers the
  // customers of a KVServer made before Start with a van that is not yet
  // running).
  Start(0);
  KVServer<float>* server = nullptr;
  if (IsServer()) {
    server = new KVServer<float>(0);
    if (handle == "vector") {
      server->set_request_handle(VectorHandle());
    } else {
      server->set_request_handle(KVServerDefaultHandle<float>());
    }
  }
  // No request before every server has its handle.
  if (!IsScheduler()) Postoffice::Get()->Barrier(0, kWorkerGroup + kServerGroup);
  if (IsWorker()) {
#ifdef FPT_H
    if (mode == "fpt") {
      RunWorkerFPT(bytes, num_keys, iters);
    } else {
      RunWorker(bytes, num_keys, iters);
    }
#else
    RunWorker(bytes, num_keys, iters);
#endif
  }
  Finalize(0, true);
  delete server;
  return 0;
}
