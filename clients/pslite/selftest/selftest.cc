// selftest: include/ps/ against fake_fpt.cc (one process holding a server
// customer and a worker customer): KV pushes and pulls with lens, key
// slicing (one server), PushPull, SimpleApp round, callbacks before Wait.
//
//   g++ -std=c++11 -Wall -Wextra -Werror -pthread -Iinclude -o /tmp/selftest
//     clients/pslite/selftest/selftest.cc clients/pslite/selftest/fake_fpt.cc
//   /tmp/selftest
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "ps/ps.h"

using namespace ps;

extern "C" void fake_fpt_fail(void);
extern "C" int fake_fpt_barriers(void);
extern "C" int fake_fpt_finalizes(void);

// "selftest customers": three customers of one process, each Start(c),
// three Barriers each and Finalize(c): each Barrier of the three is one
// node barrier, and the node is finalized once, after every customer.
int Customers() {
  std::vector<std::thread> threads;
  // Every customer has started before the first barrier: a thread slow to
  // start (a loaded machine, ThreadSanitizer) must not find the node
  // finalized already.
  std::atomic<int> started{0};
  for (int c = 0; c < 3; c++) {
    threads.emplace_back([c, &started] {
      Start(c);
      started++;
      while (started.load() < 3) std::this_thread::yield();
      for (int i = 0; i < 3; i++) Postoffice::Get()->Barrier(c, kWorkerGroup);
      if (c != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100 * c));
        // Customer 0's Finalize is waiting for this one: the node is not
        // finalized yet. (Checked before the call: once it returns,
        // customer 0 may finalize the node at any moment.)
        CHECK_EQ(fake_fpt_finalizes(), 0) << "customer " << c;
      }
      Finalize(c, false);
      if (c == 0) CHECK_EQ(fake_fpt_finalizes(), 1) << "customer 0";
    });
  }
  for (auto& t : threads) t.join();
  CHECK_EQ(fake_fpt_barriers(), 3);
  CHECK_EQ(fake_fpt_finalizes(), 1);
  std::printf("selftest: customers: PASS\n");
  return 0;
}

// "selftest fail": a pull that no server answers, then the cluster fails:
// Wait (or the handler) must end the program, status 1, with the reason.
int Fail() {
  KVServer<float> server(0);
  server.set_request_handle([](const KVMeta&, const KVPairs<float>&, KVServer<float>*) {});
  Start(0);
  KVWorker<float> kv(0, 1);
  std::vector<float> got;
  std::thread t([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    fake_fpt_fail();
  });
  t.detach();
  kv.Wait(kv.Pull({1, 2}, &got));
  std::printf("selftest: Wait returned after the cluster failed\n");
  return 0;
}

// "selftest bad CASE": one wrong call; the program must end with a check
// failure (status 1) whose message names the mistake. Every case but
// before-start starts the node first.
int Bad(const std::string& what) {
  std::vector<Key> keys = {1, 5};
  std::vector<float> vals = {1, 2, 3};
  if (what == "before-start") {
    KVWorker<float> kv(0, 1);
    kv.Push(keys, vals, std::vector<int>{1, 2});
    return 0;
  }
  KVServer<float> server(0);
  server.set_request_handle(KVServerDefaultHandle<float>());
  Start(0);
  KVWorker<float> kv(0, 1);
  if (what == "lens-sum") {
    kv.Push(keys, vals, std::vector<int>{1, 1});
  } else if (what == "lens-count") {
    kv.Push(keys, vals, std::vector<int>{3});
  } else if (what == "keys-unsorted") {
    kv.Push(std::vector<Key>{5, 1}, vals, std::vector<int>{1, 2});
  } else if (what == "pushpull-outs") {
    std::vector<float> outs(2);
    kv.PushPull(keys, vals, &outs);
  } else if (what == "customer-twice") {
    KVWorker<float> again(0, 1);
  } else if (what == "finalize-unknown") {
    Finalize(7, false);
  } else if (what == "after-finalize") {
    Finalize(0, false);
    kv.Push(keys, vals, std::vector<int>{1, 2});
  } else if (what == "fptpull-undeclared") {
    SArray<float> got;
    kv.FPTPull(SArray<Key>(std::vector<Key>{42}), &got);
  } else if (what == "fptpush-redeclared") {
    SArray<Key> key3(std::vector<Key>{3});
    kv.FPTDeclare(key3, SArray<int>(std::vector<int>{4}));
    kv.FPTPush(key3, SArray<float>(vals));
  } else {
    std::fprintf(stderr, "selftest: no bad case %s\n", what.c_str());
    return 2;
  }
  std::printf("selftest: bad case %s was accepted\n", what.c_str());
  return 0;
}

int main(int argc, char* argv[]) {
  if (argc > 2 && !std::strcmp(argv[1], "bad")) return Bad(argv[2]);
  if (argc > 1 && !std::strcmp(argv[1], "fail")) return Fail();
  if (argc > 1 && !std::strcmp(argv[1], "customers")) return Customers();
  // The server's customer is (0, 0); the worker's (0, 1).
  KVServer<float> server(0);
  server.set_request_handle(KVServerDefaultHandle<float>());
  Start(0);
  KVWorker<float> kv(0, 1);
  std::vector<Key> keys = {1, 5, kMaxKey / 2, kMaxKey - 1};
  std::vector<int> lens = {1, 3, 2, 4};
  std::vector<float> vals = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  int cbs = 0;
  for (int i = 0; i < 3; i++) kv.Wait(kv.Push(keys, vals, lens, 0, [&cbs]() { cbs++; }));
  CHECK_EQ(cbs, 3) << "push callbacks before Wait";
  std::vector<float> got;
  std::vector<int> got_lens;
  kv.Wait(kv.Pull(keys, &got, &got_lens));
  CHECK(got_lens == lens);
  for (size_t i = 0; i < vals.size(); i++) CHECK_EQ(got[i], 3 * vals[i]);
  std::vector<float> outs;
  kv.Wait(kv.PushPull(keys, vals, &outs, &got_lens));
  for (size_t i = 0; i < vals.size(); i++) CHECK_EQ(outs[i], 4 * vals[i]);
  // Empty request: completes at once.
  std::vector<float> none;
  kv.Wait(kv.Pull(std::vector<Key>(), &none));
  CHECK(none.empty());

  // SimpleApp: the worker side is (1, 2); the server side (1, 1), which
  // fake_fpt delivers node 8's messages of app 1 to.
  SimpleApp app(1, 2);
  SimpleApp srv(1, 1);
  srv.set_request_handle([](const SimpleData& req, SimpleApp* a) {
    CHECK_EQ(req.head, 7);
    a->Response(req, req.body + "!");
  });
  int responses = 0;
  app.set_response_handle([&responses](const SimpleData& res, SimpleApp*) {
    CHECK_EQ(res.body, std::string("hi!"));
    responses++;
  });
  app.Wait(app.Request(7, "hi", kServerGroup));
  CHECK_EQ(responses, 1);
  Finalize(0, false);
  std::printf("selftest: PASS\n");
  return 0;
}
