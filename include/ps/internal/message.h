/*
 * ps/internal/message.h - ps-lite's Message: a meta and data segments.
 *
 * On fpt a Message travels as one customer message (fpt_msg_send): the
 * meta's fields map onto fpt_msg_meta (request, push, pull, simple_app are
 * its FPT_MSG_* flags) and data[i] is segment i. A SimpleApp message's body
 * travels as its only segment. At most FPT_MSG_MAX_SEGMENTS segments.
 */
#ifndef PS_INTERNAL_MESSAGE_H_
#define PS_INTERNAL_MESSAGE_H_

#include <string>
#include <vector>

#include "ps/sarray.h"

namespace ps {

struct Meta {
  /* A KV request's cmd, a SimpleApp message's head. */
  int head = 0;
  int app_id = 0;
  int customer_id = 0;
  /* The requester's timestamp; a response echoes its request's. */
  int timestamp = 0;
  /* Set on delivery. */
  int sender = 0;
  /* A node id (not a group). */
  int recver = 0;
  bool request = false;
  bool push = false;
  bool pull = false;
  bool simple_app = false;
  /* A SimpleApp message's body. */
  std::string body;
  int priority = 0;
  /* An fpt_dtype when the data hold float or double values, else 0. */
  int dtype = 0;
};

struct Message {
  Meta meta;
  std::vector<SArray<char>> data;

  /* Appends val's bytes as a segment (zero copy until sent). */
  template <typename V>
  void AddData(const SArray<V>& val) {
    data.push_back(SArray<char>(val));
  }
};

}  // namespace ps
#endif  // PS_INTERNAL_MESSAGE_H_
