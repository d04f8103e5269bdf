// selftest: include/ps/ against fake_fpt.cc (one process holding a server
// customer and a worker customer): KV pushes and pulls with lens, key
// slicing (one server), PushPull, SimpleApp round, callbacks before Wait;
// requests that come before their app is ready ("late").
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
extern "C" int fake_fpt_in_block(const void* p);
extern "C" int fake_fpt_blocks(void);

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

// "selftest late": requests sent before their app exists, as a ps-lite
// worker may send them before a server has made its KVServer. The fake
// hands them over as the customer registers, on its thread, at once: a
// push must wait for the KVServer's set_request_handle and then be
// summed, and a SimpleApp request for the app's constructor to return.
int Late() {
  Start(0);
  KVWorker<float> kv(0, 1);
  int push = kv.Push({1, 5}, {2, 3});
  SimpleApp app(1, 2);
  int responses = 0;
  app.set_response_handle([&responses](const SimpleData& res, SimpleApp*) {
    CHECK_EQ(res.body, std::string("")) << "the default handle's answer";
    responses++;
  });
  int req = app.Request(7, "hi", kServerGroup);
  KVServer<float> server(0);
  SimpleApp srv(1, 1);
  app.Wait(req);
  CHECK_EQ(responses, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  server.set_request_handle(KVServerDefaultHandle<float>());
  kv.Wait(push);
  std::vector<float> got;
  kv.Wait(kv.Pull({1, 5}, &got));
  CHECK(got == std::vector<float>({2, 3}));
  Finalize(0, false);
  std::printf("selftest: late: PASS\n");
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

// Keys from..to-1 ascending.
SArray<Key> KeyRun(Key from, Key to) {
  SArray<Key> keys(to - from);
  for (Key k = from; k < to; ++k) keys[k - from] = k;
  return keys;
}

// KVServerDefaultHandle's store: a key list pushed again and again (kept
// as one block), then lists that meet it (the block broken into keys), a
// key never pushed, keys of two values; every value checked exactly.
void Store(KVWorker<float>* kv) {
  SArray<Key> a = KeyRun(1000, 2000);
  SArray<float> ones(a.size(), 1);
  for (int i = 0; i < 3; i++) kv->Wait(kv->ZPush(a, ones));
  SArray<float> got;
  SArray<int> got_lens;
  kv->Wait(kv->ZPull(a, &got, &got_lens));
  // One server answered: the pull's values are the received message's
  // memory, not a copy of it.
  CHECK(fake_fpt_in_block(got.data())) << "the pulled values were copied";
  CHECK_EQ(got.size(), a.size());
  CHECK_EQ(got_lens.size(), a.size());
  for (size_t i = 0; i < a.size(); i++) {
    CHECK_EQ(got[i], 3) << "key " << a[i];
    CHECK_EQ(got_lens[i], 1) << "key " << a[i];
  }
  // The pull's vals already have their size: overwritten in place.
  float* before = got.data();
  kv->Wait(kv->ZPush(a, ones));
  kv->Wait(kv->ZPull(a, &got));
  CHECK(got.data() == before);
  for (size_t i = 0; i < a.size(); i++) CHECK_EQ(got[i], 4) << "key " << a[i];
  // Keys 1500..2499: half of them in the block.
  SArray<Key> b = KeyRun(1500, 2500);
  SArray<float> twos(b.size(), 2);
  kv->Wait(kv->ZPush(b, twos));
  SArray<Key> ab = KeyRun(1000, 2500);
  SArray<float> all;
  kv->Wait(kv->ZPull(ab, &all));
  CHECK_EQ(all.size(), ab.size());
  for (size_t i = 0; i < ab.size(); i++) {
    float want = (ab[i] < 1500 ? 4 : 0) + (ab[i] >= 1500 && ab[i] < 2000 ? 4 : 0) + (ab[i] >= 1500 ? 2 : 0);
    CHECK_EQ(all[i], want) << "key " << ab[i];
  }
  kv->Wait(kv->ZPush(a, ones));
  kv->Wait(kv->ZPull(a, &got));
  for (size_t i = 0; i < a.size(); i++) {
    CHECK_EQ(got[i], a[i] < 1500 ? 5 : 7) << "key " << a[i] << " after the block broke";
  }
  // Two values a key, and a key never pushed (one 0) among them.
  SArray<Key> c = KeyRun(3000, 3010);
  SArray<float> pairs(2 * c.size());
  for (size_t i = 0; i < pairs.size(); i++) pairs[i] = float(i);
  kv->Wait(kv->ZPush(c, pairs));
  kv->Wait(kv->ZPush(c, pairs));
  SArray<float> cv;
  SArray<int> cl;
  kv->Wait(kv->ZPull(c, &cv, &cl));
  CHECK_EQ(cv.size(), pairs.size());
  for (size_t i = 0; i < pairs.size(); i++) CHECK_EQ(cv[i], 2 * pairs[i]);
  for (int l : cl) CHECK_EQ(l, 2);
  SArray<Key> cx = KeyRun(3009, 3011);
  cv.clear();
  cl.clear();
  kv->Wait(kv->ZPull(cx, &cv, &cl));
  CHECK_EQ(cv.size(), 3u);
  CHECK_EQ(cl.size(), 2u);
  CHECK_EQ(cl[0], 2);
  CHECK_EQ(cl[1], 1);
  CHECK_EQ(cv[0], 36);
  CHECK_EQ(cv[1], 38);
  CHECK_EQ(cv[2], 0);
}

int main(int argc, char* argv[]) {
  if (argc > 2 && !std::strcmp(argv[1], "bad")) return Bad(argv[2]);
  if (argc > 1 && !std::strcmp(argv[1], "fail")) return Fail();
  if (argc > 1 && !std::strcmp(argv[1], "customers")) return Customers();
  if (argc > 1 && !std::strcmp(argv[1], "late")) return Late();
  // The server's customer is (0, 0); the worker's (0, 1).
  KVServer<float> server(0);
  KVServerDefaultHandle<float> handle;
  server.set_request_handle([&handle](const KVMeta& meta, const KVPairs<float>& data, KVServer<float>* s) {
    // The request's arrays are views of the received message.
    CHECK(data.keys.empty() || fake_fpt_in_block(data.keys.data())) << "the request's keys were copied";
    CHECK(data.vals.empty() || fake_fpt_in_block(data.vals.data())) << "the request's values were copied";
    handle(meta, data, s);
  });
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

  Store(&kv);

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
  // Every received message's memory was released once its arrays went.
  CHECK_EQ(fake_fpt_blocks(), 0);
  std::printf("selftest: PASS\n");
  return 0;
}
