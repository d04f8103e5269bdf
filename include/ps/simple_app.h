/*
 * ps/simple_app.h - ps::SimpleApp: requests and responses of an int head
 * and a string body between customers, as ps-lite's.
 *
 * On fpt the body travels as the message's one segment (at most
 * FPT_MAX_FRAME_BYTES). As in ps-lite, the scheduler is a node like the
 * others: a SimpleApp on it sends to and receives from any node or group
 * (its messages travel over fpt's control plane, at most 32 MiB each).
 */
#ifndef PS_SIMPLE_APP_H_
#define PS_SIMPLE_APP_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>

#include "ps/internal/customer.h"
#include "ps/internal/message.h"
#include "ps/internal/postoffice.h"

namespace ps {

/* A received request or response. */
struct SimpleData {
  int head;
  std::string body;
  int sender;
  int timestamp;
  int customer_id;
};

class SimpleApp {
 public:
  /* Registers customer (app_id, customer_id). On a server, messages of
   * app_id come to customer (app_id, app_id), as in ps-lite. */
  explicit SimpleApp(int app_id, int customer_id);

  virtual ~SimpleApp() { Detach(); }

  /* Sends a request to every node of recv_id (a node id or a group of
   * servers and workers); returns its timestamp: Wait(ts) returns once
   * every one of them has responded. */
  virtual inline int Request(int req_head, const std::string& req_body, int recv_id);

  /* Blocks until every response of request timestamp is in and handled. */
  virtual inline void Wait(int timestamp) { obj_->WaitRequest(timestamp); }

  /* Responds to recv_req (same head, this body). */
  virtual inline void Response(const SimpleData& recv_req, const std::string& res_body = "");

  using Handle = std::function<void(const SimpleData& recved, SimpleApp* app)>;

  /* The request handler (by default: respond with an empty body). */
  virtual inline void set_request_handle(const Handle& request_handle) {
    CHECK(request_handle) << "invalid request handle";
    request_handle_ = request_handle;
  }

  /* The response handler (by default: nothing). */
  virtual inline void set_response_handle(const Handle& response_handle) {
    CHECK(response_handle) << "invalid response handle";
    response_handle_ = response_handle;
  }

  virtual inline Customer* get_customer() { return obj_; }

 protected:
  /* For KVWorker and KVServer, which make their own customer. */
  inline SimpleApp() : obj_(nullptr) {
    request_handle_ = [](const SimpleData& recved, SimpleApp* app) { app->Response(recved); };
    response_handle_ = [](const SimpleData&, SimpleApp*) {};
  }

  /* Handles one SimpleApp message. */
  virtual inline void Process(const Message& msg);

  /* Registers obj_, the customer (app_id, customer_id). Its handler may
   * run at once on libfpt's thread, before obj_ is set or the derived
   * class is constructed (messages that came before the customer wait for
   * it and are handed over when it registers): each message waits until
   * the app is opened. */
  inline void Attach(int app_id, int customer_id);
  /* Lets messages through to Process: the app is ready for them. */
  inline void Open();
  /* Unregisters obj_ (a message waiting for Open then ends the program:
   * it would never be answered); every destructor calls it first. */
  inline void Detach();

  Customer* obj_;

 private:
  /* Blocks the handler's thread until Open, warning every 10 s while it
   * waits; ends the program after FPT_START_TIMEOUT (default 300 s). */
  inline void AwaitOpen(const Message& msg);

  Handle request_handle_;
  Handle response_handle_;
  std::atomic<bool> open_{false};
  std::mutex open_mu_;
  std::condition_variable open_cv_;
  bool detaching_ = false;
};

////////////////////////////////////////////////////////////////////////////

inline SimpleApp::SimpleApp(int app_id, int customer_id) : SimpleApp() {
  Attach(app_id, customer_id);
  Open();
}

inline void SimpleApp::Attach(int app_id, int customer_id) {
  obj_ = new Customer(app_id, customer_id, [this](const Message& msg) {
    AwaitOpen(msg);
    Process(msg);
  });
}

inline void SimpleApp::Open() {
  {
    std::lock_guard<std::mutex> lk(open_mu_);
    open_.store(true, std::memory_order_release);
  }
  open_cv_.notify_all();
}

inline void SimpleApp::Detach() {
  {
    std::lock_guard<std::mutex> lk(open_mu_);
    detaching_ = true;
  }
  open_cv_.notify_all();
  delete obj_;
  obj_ = nullptr;
}

inline void SimpleApp::AwaitOpen(const Message& msg) {
  if (open_.load(std::memory_order_acquire)) return;
  // As long as libfpt holds a message for a customer not registered yet.
  const char* limit_env = Environment::Get()->find("FPT_START_TIMEOUT");
  double limit = limit_env ? std::atof(limit_env) : 0;
  if (!(limit > 0)) limit = 300;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit));
  Clock::time_point warn = start + std::chrono::seconds(10);
  std::unique_lock<std::mutex> lk(open_mu_);
  while (!open_.load(std::memory_order_relaxed)) {
    CHECK(!detaching_) << "app " << msg.meta.app_id << ": destroyed before it was ready for a message from node "
                       << msg.meta.sender << " (a KVServer needs set_request_handle)";
    Clock::time_point now = Clock::now();
    CHECK(now < deadline) << "app " << msg.meta.app_id << ": a message from node " << msg.meta.sender
                          << " waited FPT_START_TIMEOUT (" << limit
                          << " s) for the app to be ready (a KVServer needs set_request_handle)";
    if (now >= warn) {
      LOG(WARNING) << "app " << msg.meta.app_id << ": a message from node " << msg.meta.sender << " has waited "
                   << std::chrono::duration_cast<std::chrono::seconds>(now - start).count()
                   << " s for the app to be ready (a KVServer needs set_request_handle)";
      warn += std::chrono::seconds(10);
    }
    open_cv_.wait_until(lk, std::min(deadline, warn));
  }
}

inline int SimpleApp::Request(int req_head, const std::string& req_body, int recv_id) {
  Postoffice* po = Postoffice::Get();
  po->CheckRunning("SimpleApp::Request");
  Message msg;
  msg.meta.head = req_head;
  msg.meta.body = req_body;
  msg.meta.request = true;
  msg.meta.simple_app = true;
  msg.meta.app_id = obj_->app_id();
  msg.meta.customer_id = obj_->customer_id();
  const std::vector<int> recvers = po->GetNodeIDs(recv_id);
  int ts = obj_->NewRequestCount(static_cast<int>(recvers.size()));
  msg.meta.timestamp = ts;
  for (int r : recvers) {
    msg.meta.recver = r;
    po->van()->Send(msg);
  }
  return ts;
}

inline void SimpleApp::Response(const SimpleData& req, const std::string& res_body) {
  Message msg;
  msg.meta.head = req.head;
  msg.meta.body = res_body;
  msg.meta.timestamp = req.timestamp;
  msg.meta.request = false;
  msg.meta.simple_app = true;
  msg.meta.app_id = obj_->app_id();
  msg.meta.customer_id = req.customer_id;
  msg.meta.recver = req.sender;
  Postoffice::Get()->van()->Send(msg);
}

inline void SimpleApp::Process(const Message& msg) {
  SimpleData recv;
  recv.sender = msg.meta.sender;
  recv.head = msg.meta.head;
  recv.body = msg.meta.body;
  recv.timestamp = msg.meta.timestamp;
  recv.customer_id = msg.meta.customer_id;
  if (msg.meta.request) {
    CHECK(request_handle_);
    request_handle_(recv, this);
  } else {
    CHECK(response_handle_);
    response_handle_(recv, this);
  }
}

}  // namespace ps
#endif  // PS_SIMPLE_APP_H_
