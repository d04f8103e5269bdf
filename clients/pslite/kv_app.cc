// kv_app: a ps-lite KV program (as ps-lite's tests/test_kv_app.cc), written
// against ps:: only. Every role runs it (DMLC_ROLE says which):
//
//   - servers: a KVServer<float> with KVServerDefaultHandle, which adds
//     every push into its store and answers pulls from it;
//   - workers: keys spread over the whole key space (so every server gets
//     a slice), values of different lengths (lens), pushed -repeat times;
//     after a worker barrier, a Pull must give exactly the sum over the
//     workers and the repeats, then a PushPull round adds once more; then
//     FPTPush / FPTPull through fpt's own aggregation: the init round gives
//     worker 0's values, the next the sum over the workers.
//   - the scheduler only starts and finalizes (fpt's scheduler has no
//     customers).
//
// Values are small integers, exact in float whatever the order of the
// additions. Prints "PASS" lines; any mismatch is a CHECK failure (exit 1).
//
//   kv_app [-keys N] [-repeat R]

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ps/ps.h"

using namespace ps;

namespace {

float Value(int rank, size_t key_index, size_t j) { return float((rank * 7 + key_index * 3 + j) % 13 + 1); }

int Len(size_t key_index) { return 1 + int(key_index % 5); }

void RunWorker(int num_keys, int repeat) {
  int rank = MyRank(), workers = NumWorkers();
  KVWorker<float> kv(0, 0);
  std::vector<Key> keys(num_keys);
  std::vector<int> lens(num_keys);
  std::vector<float> vals;
  for (int i = 0; i < num_keys; ++i) {
    keys[i] = kMaxKey / num_keys * i + 1;
    lens[i] = Len(i);
    for (int j = 0; j < lens[i]; ++j) vals.push_back(Value(rank, i, j));
  }
  auto expect = [&](int rounds) {
    std::vector<float> want;
    for (int i = 0; i < num_keys; ++i) {
      for (int j = 0; j < lens[i]; ++j) {
        float s = 0;
        for (int r = 0; r < workers; ++r) s += Value(r, i, j);
        want.push_back(s * rounds);
      }
    }
    return want;
  };

  std::vector<int> ts;
  for (int i = 0; i < repeat; ++i) ts.push_back(kv.Push(keys, vals, lens));
  for (int t : ts) kv.Wait(t);
  Postoffice::Get()->Barrier(0, kWorkerGroup);

  std::vector<float> got;
  std::vector<int> got_lens;
  kv.Wait(kv.Pull(keys, &got, &got_lens));
  CHECK(got_lens == lens) << "pulled lens differ";
  std::vector<float> want = expect(repeat);
  CHECK_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK_EQ(got[i], want[i]) << "pull: value " << i;
  std::printf("worker %d: PASS: %d keys pushed %d times by %d workers, pulled exactly\n", rank, num_keys, repeat,
              workers);

  // PushPull: the answer includes at least this worker's push; after a
  // barrier, every push of the round is in. (A barrier first: no worker's
  // PushPull may reach a server before every worker's Pull above.)
  Postoffice::Get()->Barrier(0, kWorkerGroup);
  std::vector<float> outs;
  kv.Wait(kv.PushPull(keys, vals, &outs, &got_lens));
  CHECK_EQ(outs.size(), vals.size());
  Postoffice::Get()->Barrier(0, kWorkerGroup);
  got.clear();
  // Zero-copy pull with a callback.
  SArray<Key> skeys(keys);
  SArray<float> svals;
  SArray<int> slens;
  bool called = false;
  kv.Wait(kv.ZPull(skeys, &svals, &slens, 0, [&called]() { called = true; }));
  CHECK(called) << "the ZPull callback did not run before Wait returned";
  want = expect(repeat + 1);
  CHECK_EQ(svals.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK_EQ(svals[i], want[i]) << "pushpull: value " << i;
  std::printf("worker %d: PASS: PushPull and ZPull exact\n", rank);

  // fpt's aggregation: declare on every worker, then push and pull.
  SArray<int> flens(lens);
  SArray<Key> fkeys(keys);
  kv.FPTDeclare(fkeys, flens);
  Postoffice::Get()->Barrier(0, kWorkerGroup);
  SArray<float> fvals(vals), fout;
  kv.Wait(kv.FPTPush(fkeys, fvals, flens));
  kv.Wait(kv.FPTPull(fkeys, &fout));
  std::vector<float> w0;
  for (int i = 0; i < num_keys; ++i) {
    for (int j = 0; j < lens[i]; ++j) w0.push_back(Value(0, i, j));
  }
  CHECK_EQ(fout.size(), w0.size());
  for (size_t i = 0; i < w0.size(); ++i) CHECK_EQ(fout[i], w0[i]) << "FPTPull of the init round: value " << i;
  SArray<float> fout2;
  kv.Wait(kv.FPTPush(fkeys, fvals, flens));
  kv.Wait(kv.FPTPull(fkeys, &fout2));
  want = expect(1);
  for (size_t i = 0; i < want.size(); ++i) CHECK_EQ(fout2[i], want[i]) << "FPTPull: value " << i;
  std::printf("worker %d: PASS: FPTPush/FPTPull: init round and sum exact\n", rank);
}

}  // namespace

int main(int argc, char* argv[]) {
  int num_keys = 100, repeat = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "-keys")) num_keys = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "-repeat")) repeat = std::atoi(argv[i + 1]);
  }
  CHECK_GT(num_keys, 0);
  CHECK_GT(repeat, 0);
  KVServer<float>* server = nullptr;
  if (IsServer()) {
    // Constructed before Start, as MXNet's server is: its customer is
    // registered when the node starts.
    server = new KVServer<float>(0);
    server->set_request_handle(KVServerDefaultHandle<float>());
    RegisterExitCallback([server]() { delete server; });
  }
  Start(0);
  if (IsWorker()) RunWorker(num_keys, repeat);
  Finalize(0, true);
  std::printf("%s: done\n", IsWorker() ? "worker" : IsServer() ? "server" : "scheduler");
  return 0;
}
