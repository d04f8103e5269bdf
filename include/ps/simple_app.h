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

#include <functional>
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

  /* Makes obj_, the customer (app_id, customer_id), closed: libfpt holds
   * its messages (those that came before it too) until obj_->Open(), which
   * the constructor calls once the app is ready for them (a KVServer's
   * set_request_handle), so that Process never runs before obj_ is set
   * or the derived class is constructed. */
  inline void Attach(int app_id, int customer_id);
  /* Unregisters obj_: when it returns, Process is not running and will not
   * run again. Every destructor calls it first, before its class's members
   * (the handle Process calls) are gone. */
  void Detach() {
    delete obj_;
    obj_ = nullptr;
  }

  Customer* obj_;

 private:
  Handle request_handle_;
  Handle response_handle_;
};

////////////////////////////////////////////////////////////////////////////

inline SimpleApp::SimpleApp(int app_id, int customer_id) : SimpleApp() {
  Attach(app_id, customer_id);
  obj_->Open();
}

inline void SimpleApp::Attach(int app_id, int customer_id) {
  obj_ = new Customer(app_id, customer_id, [this](const Message& msg) { Process(msg); }, false);
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
