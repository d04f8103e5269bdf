// simple_app: a SimpleApp request/response round (as ps-lite's
// tests/test_simple_app.cc), written against ps:: only. Every server and
// worker makes SimpleApp(0, 0); each sends -n requests (head 1, body
// "test <i>") to the other side (workers to kServerGroup, servers to
// kWorkerGroup), which answers each with the body reversed; Wait(ts)
// returns once every node of the group has answered. After a barrier each
// node checks it handled exactly n requests from every node of the other
// side and got every response. The app is made, and its handlers set,
// before Start, so that no request finds the default handler.
//
// The scheduler takes no part here (scheduler_app.cc has apps on it).
//
//   simple_app [-n N]

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ps/ps.h"

using namespace ps;

namespace {

std::atomic<int> g_requests{0};
std::atomic<int> g_responses{0};

std::string Reverse(std::string s) {
  std::reverse(s.begin(), s.end());
  return s;
}

void ReqHandle(const SimpleData& req, SimpleApp* app) {
  CHECK_EQ(req.head, 1);
  CHECK_EQ(req.body.compare(0, 5, "test "), 0) << "request body " << req.body;
  app->Response(req, Reverse(req.body));
  ++g_requests;
}

void ResHandle(const SimpleData& res, SimpleApp*) {
  CHECK_EQ(res.head, 1);
  CHECK_EQ(res.body.substr(res.body.size() - 5), std::string(" tset")) << "response body " << res.body;
  ++g_responses;
}

}  // namespace

int main(int argc, char* argv[]) {
  int n = 100;
  if (argc == 3 && !std::strcmp(argv[1], "-n")) n = std::atoi(argv[2]);
  if (IsScheduler()) {
    Start(0);
    Finalize(0, true);
    std::printf("scheduler: done\n");
    return 0;
  }
  SimpleApp app(0, 0);
  app.set_request_handle(ReqHandle);
  app.set_response_handle(ResHandle);
  Start(0);
  int group = IsWorker() ? kServerGroup : kWorkerGroup;
  int peers = IsWorker() ? NumServers() : NumWorkers();
  int others = peers;  // the other side sends to us as we send to it
  std::vector<int> ts;
  for (int i = 0; i < n; ++i) ts.push_back(app.Request(1, "test " + std::to_string(i), group));
  for (int t : ts) app.Wait(t);
  CHECK_EQ(g_responses.load(), n * peers) << "responses";
  // Every node has waited for its requests: every request to this one has
  // been handled.
  Postoffice::Get()->Barrier(0, kWorkerGroup + kServerGroup);
  CHECK_EQ(g_requests.load(), n * others) << "requests handled";
  std::printf("%s %d: PASS: %d requests to %d nodes answered, %d requests handled\n",
              IsWorker() ? "worker" : "server", MyRank(), n, peers, g_requests.load());
  std::fflush(stdout);
  Finalize(0, true);
  return 0;
}
