// benchmark: push+pull goodput of a ps-lite program on fpt (as ps-lite's
// tests/test_kv_app_benchmark.cc), written against ps:: only. Each worker
// pushes -bytes of float values over -keys keys (spread over every
// server's key range) and pulls them back, -iters times, timing the
// communication; servers run KVServerDefaultHandle. After a worker
// barrier, a final pull must be exactly the sum of every worker's pushes.
// Prints "PASS: ... goodput G Gbit/s" (bytes pushed and pulled over the
// time spent). The scheduler only starts and finalizes.
//
// With -mode fpt the workers use FPTPush/FPTPull instead (fpt's own
// aggregation; the servers' handler sees nothing): every key declared, one
// untimed init round, then -iters timed rounds whose every pulled sum is
// checked exactly.
//
//   benchmark [-bytes B] [-keys N] [-iters I] [-mode classic|fpt]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
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
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = Value(MyRank(), i);
  return vals;
}

void RunWorker(size_t bytes, int num_keys, int iters) {
  int rank = MyRank(), workers = NumWorkers();
  size_t per_key = ElemsPerKey(bytes, num_keys);
  KVWorker<float> kv(0, 0);
  SArray<Key> keys(num_keys);
  for (int i = 0; i < num_keys; ++i) keys[i] = kMaxKey / num_keys * i;
  SArray<float> vals = Values(per_key, num_keys);
  SArray<float> outs;
  double seconds = 0;
  for (int it = 0; it < iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    kv.Wait(kv.ZPush(keys, vals));
    kv.Wait(kv.ZPull(keys, &outs));
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Postoffice::Get()->Barrier(0, kWorkerGroup);
  kv.Wait(kv.ZPull(keys, &outs));
  CHECK_EQ(outs.size(), vals.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    float want = 0;
    for (int r = 0; r < workers; ++r) want += Value(r, i);
    CHECK_EQ(outs[i], want * iters) << "value " << i;
  }
  double total = 2.0 * double(vals.size() * sizeof(float)) * iters;
  std::printf("worker %d: PASS: %d iterations of %.1f MiB over %d keys pushed and pulled, exact; goodput %.3f Gbit/s\n",
              rank, iters, double(vals.size() * sizeof(float)) / (1 << 20), num_keys,
              seconds > 0 ? total * 8 / seconds / 1e9 : 0.0);
  std::fflush(stdout);
}

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
  double seconds = 0;
  for (int it = 0; it < iters; ++it) {
    auto t0 = std::chrono::steady_clock::now();
    int push = kv.FPTPush(keys, vals);
    kv.Wait(kv.FPTPull(keys, &outs));
    kv.Wait(push);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = 0; i < outs.size(); ++i) {
      float want = 0;
      for (int r = 0; r < workers; ++r) want += Value(r, i);
      CHECK_EQ(outs[i], want) << "iteration " << it << " value " << i;
    }
  }
  double total = 2.0 * double(vals.size() * sizeof(float)) * iters;
  std::printf("worker %d: PASS: FPTPush/FPTPull: %d iterations of %.1f MiB over %d keys, exact; goodput %.3f Gbit/s\n",
              rank, iters, double(vals.size() * sizeof(float)) / (1 << 20), num_keys,
              seconds > 0 ? total * 8 / seconds / 1e9 : 0.0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char* argv[]) {
  size_t bytes = 4 << 20;
  int num_keys = 16, iters = 10;
  std::string mode = "classic";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-bytes")) bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "-keys")) num_keys = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-iters")) iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-mode")) mode = argv[i + 1];
  }
  CHECK_GT(num_keys, 0);
  CHECK_GT(iters, 0);
  CHECK(mode == "classic" || mode == "fpt") << "-mode " << mode << ": want classic or fpt";
  KVServer<float>* server = nullptr;
  if (IsServer()) {
    server = new KVServer<float>(0);
    server->set_request_handle(KVServerDefaultHandle<float>());
  }
  Start(0);
  if (IsWorker()) {
    if (mode == "fpt") {
      RunWorkerFPT(bytes, num_keys, iters);
    } else {
      RunWorker(bytes, num_keys, iters);
    }
  }
  Finalize(0, true);
  delete server;
  return 0;
}
