// scheduler_app: apps on the scheduler (written against ps:: only). As in
// ps-lite, the scheduler is a node like the others: every node, the
// scheduler included, makes SimpleApp(0, 0) before Start and sends -n
// requests (head 1, body "req <i> from <id>") to kScheduler + kServerGroup
// + kWorkerGroup, itself included; every node answers each with the body
// reversed, and checks that the request names its sender; each response is
// checked to reverse a request of this node. Then each server and worker
// tells the scheduler it is done (head 2) and passes a barrier of the
// servers and workers; every node checks it handled exactly n requests
// from every node (the scheduler once every other node said it is done:
// their requests to it were answered before).
//
//   scheduler_app [-n N]

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ps/ps.h"

using namespace ps;

namespace {

std::mutex g_mu;
std::map<int, int> g_handled;  // requests handled, by sender
std::atomic<int> g_responses{0};
std::atomic<int> g_done{0};
int g_self = 0;

std::string Reverse(std::string s) {
  std::reverse(s.begin(), s.end());
  return s;
}

void ReqHandle(const SimpleData& req, SimpleApp* app) {
  if (req.head == 2) {
    CHECK_EQ(req.body, std::string("done"));
    ++g_done;
    app->Response(req, "ok");
    return;
  }
  CHECK_EQ(req.head, 1);
  std::string from = " from " + std::to_string(req.sender);
  CHECK(req.body.compare(0, 4, "req ") == 0 && req.body.size() > from.size() &&
        req.body.compare(req.body.size() - from.size(), from.size(), from) == 0)
      << "request body " << req.body << " from node " << req.sender;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_handled[req.sender]++;
  }
  app->Response(req, Reverse(req.body));
}

void ResHandle(const SimpleData& res, SimpleApp*) {
  if (res.head == 2) {
    CHECK_EQ(res.body, std::string("ok"));
    return;
  }
  CHECK_EQ(res.head, 1);
  std::string body = Reverse(res.body);
  std::string mine = " from " + std::to_string(g_self);
  CHECK(body.compare(0, 4, "req ") == 0 && body.size() > mine.size() &&
        body.compare(body.size() - mine.size(), mine.size(), mine) == 0)
      << "response body " << res.body << " from node " << res.sender;
  ++g_responses;
}

}  // namespace

int main(int argc, char* argv[]) {
  int n = 20;
  if (argc == 3 && !std::strcmp(argv[1], "-n")) n = std::atoi(argv[2]);
  SimpleApp app(0, 0);
  app.set_request_handle(ReqHandle);
  app.set_response_handle(ResHandle);
  Start(0);
  g_self = Postoffice::Get()->my_id();
  const int all = kScheduler + kServerGroup + kWorkerGroup;
  const std::vector<int> nodes = Postoffice::Get()->GetNodeIDs(all);
  const int total = static_cast<int>(nodes.size());
  std::vector<int> ts;
  for (int i = 0; i < n; ++i) ts.push_back(app.Request(1, "req " + std::to_string(i) + " from " + std::to_string(g_self), all));
  for (int t : ts) app.Wait(t);
  CHECK_EQ(g_responses.load(), n * total) << "responses";
  if (IsScheduler()) {
    // Every other node waited for its requests before it said it is done.
    while (g_done.load() < total - 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } else {
    app.Wait(app.Request(2, "done", kScheduler));
    Postoffice::Get()->Barrier(0, kWorkerGroup + kServerGroup);
  }
  {
    std::lock_guard<std::mutex> lk(g_mu);
    for (int id : nodes) CHECK_EQ(g_handled[id], n) << "requests handled from node " << id;
    CHECK_EQ(g_handled.size(), nodes.size()) << "senders";
  }
  std::printf("node %d: PASS: %d requests to %d nodes answered, %d from each handled\n", g_self, n, total, n);
  std::fflush(stdout);
  Finalize(0, true);
  return 0;
}
