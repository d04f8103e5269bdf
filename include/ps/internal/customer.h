/*
 * ps/internal/customer.h - ps::Customer: a handler of messages registered
 * under (app_id, customer_id), and the requests it has in flight.
 *
 * On fpt a Customer is an fpt_customer_add_keep registration, made when
 * it is constructed (or opened, if it is made closed), or at ps::Start if
 * that is later. libfpt runs its handler on a thread of its own, one
 * message at a time in arrival order; the handler makes the message's segments SArrays that share the
 * block libfpt read the message into (no copy, as ps-lite's zero-copy
 * receive; the last of them releases the block), calls the RecvHandle and
 * then, for a response, counts it for WaitRequest, as ps-lite's
 * Customer::Receiving does.
 *
 * When the cluster fails libfpt calls the handler once with FPT_MSG_FAILED:
 * every WaitRequest then ends the program (LOG(FATAL)) with libfpt's reason,
 * and so does the handler itself unless ps::Finalize is under way (whose
 * fpt_finalize reports the failure): a failure never leaves a program
 * waiting.
 */
#ifndef PS_INTERNAL_CUSTOMER_H_
#define PS_INTERNAL_CUSTOMER_H_

#include <fpt.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ps/internal/message.h"

namespace ps {

class Customer {
 public:
  using RecvHandle = std::function<void(const Message& recved)>;

  /* Registers the customer (ps-lite's Postoffice::AddCustomer);
   * registering (app_id, customer_id) twice in a process is a check
   * failure. Its handler gets messages once the node has started and the
   * customer is open: one made closed (open false) gets none until Open,
   * and libfpt holds what comes for it meanwhile, as for a customer not
   * constructed yet (up to FPT_START_TIMEOUT). */
  Customer(int app_id, int customer_id, const RecvHandle& recv_handle, bool open = true);
  /* Opens a closed customer: what libfpt holds for it comes now. */
  void Open();
  /* Unregisters it: when it returns, the handler is not running and will
   * not run again. */
  ~Customer();

  int app_id() { return app_id_; }
  int customer_id() { return customer_id_; }

  /* A new request expecting one response from every node of recver (a
   * node id or a group); returns its timestamp. */
  int NewRequest(int recver);
  /* A new request expecting num responses (fpt's own completions count as
   * one). */
  int NewRequestCount(int num);
  /* Blocks until request timestamp has all its responses (ends the
   * program if the cluster fails first). */
  void WaitRequest(int timestamp);
  /* How many responses timestamp has. */
  int NumResponse(int timestamp);
  /* Counts num more responses of timestamp. */
  void AddResponse(int timestamp, int num = 1);

  /* The cluster failed (reason: libfpt's message): wakes every waiter,
   * which ends the program. */
  void Fail(const std::string& reason);

  /* The fpt_msg_keep_handler of every Customer; user_data is the
   * Customer. */
  static void Handler(const fpt_msg_meta* meta, const fpt_segment* segs, size_t num_segs, void* block,
                      void* user_data);

 private:
  void CheckTimestamp(int timestamp, const char* what);

  int app_id_;
  int customer_id_;
  RecvHandle recv_handle_;
  std::mutex tracker_mu_;
  std::condition_variable tracker_cond_;
  /* Per timestamp: responses expected, responses in. */
  std::vector<std::pair<int, int>> tracker_;
  bool failed_ = false;
  std::string failure_;
  /* Whether the handler may get messages (Postoffice's mu_ guards it). */
  bool open_;

  friend class Postoffice;

  Customer(const Customer&) = delete;
  Customer& operator=(const Customer&) = delete;
};

}  // namespace ps

/* Customer's members that need the Postoffice are defined there. */
#include "ps/internal/postoffice.h"

#endif  // PS_INTERNAL_CUSTOMER_H_
