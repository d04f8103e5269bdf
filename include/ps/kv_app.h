/*
 * ps/kv_app.h - ps::KVWorker and ps::KVServer: key-value pushes and pulls
 * between workers and servers, as ps-lite's, over fpt's customer messages;
 * and FPTPush / FPTPull, which go to fpt's own aggregation (fpt_push /
 * fpt_pull) instead of a KVServer.
 *
 * A request is sliced over the servers by key range (the slicer, by default
 * the ranges of Postoffice::GetServerKeyRanges); each non-empty slice is
 * one message to one server, its data the segments keys, vals and (if
 * given) lens. Wait(ts) returns once every server has answered and the
 * callback has run; a pull's vals (and lens) are resized when empty. A
 * slice is at most FPT_MAX_FRAME_BYTES.
 */
#ifndef PS_KV_APP_H_
#define PS_KV_APP_H_

#include <fpt.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ps/base.h"
#include "ps/simple_app.h"

namespace ps {

/*
 * A list of key-value pairs. keys are unique and ascending. If lens is
 * empty every value has vals.size()/keys.size() elements; else key i owns
 * lens[i] elements of vals, laid end to end.
 */
template <typename Val>
struct KVPairs {
  SArray<Key> keys;
  SArray<Val> vals;
  SArray<int> lens;
  int priority = 0;
};

namespace internal {
/* Makes *dst the array src without a copy when dst is an SArray; a
 * std::vector cannot take memory over. */
template <typename V>
bool TakeOver(SArray<V>* dst, const SArray<V>& src) {
  *dst = src;
  return true;
}
template <typename C, typename V>
bool TakeOver(C*, const SArray<V>&) {
  return false;
}
/* Resizes an array that a copy fills next: an SArray without setting the
 * new elements first. */
template <typename V>
void ResizeForCopy(SArray<V>* a, size_t n) {
  a->resize_uninitialized(n);
}
template <typename C>
void ResizeForCopy(C* a, size_t n) {
  a->resize(n);
}
}  // namespace internal

/* The fpt_dtype of values of type Val: float and double are tensor values,
 * anything else 0. */
template <typename Val>
struct FptDtypeOf {
  static constexpr int value = std::is_same<Val, float>::value    ? FPT_FLOAT32
                               : std::is_same<Val, double>::value ? FPT_FLOAT64
                                                                  : 0;
};

/* The tensors this process has declared to fpt (fpt_declare is per node):
 * FPTPush declares a key on its first push. */
class FptDeclarations {
 public:
  static FptDeclarations* Get() {
    static FptDeclarations* d = new FptDeclarations();
    return d;
  }
  /* Declares key as bytes of dtype with priority, unless it is already:
   * then the size and dtype must agree (a priority change re-declares). */
  void Ensure(Key key, uint64_t bytes, int dtype, int priority, const char* what) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = decl_.find(key);
    if (it != decl_.end()) {
      CHECK_EQ(it->second.bytes, bytes) << what << ": key " << key << " was declared as " << it->second.bytes
                                        << " bytes, this call gives " << bytes;
      CHECK_EQ(it->second.dtype, dtype) << what << ": key " << key << " was declared with another dtype";
      if (it->second.priority == priority) return;
    }
    PS_FPT_CHECK(fpt_declare(key, bytes, dtype, priority), what << ": fpt_declare of key " << key);
    decl_[key] = Decl{bytes, dtype, priority};
  }
  /* The declared bytes of key, or 0 if it is not declared. */
  uint64_t Bytes(Key key) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = decl_.find(key);
    return it == decl_.end() ? 0 : it->second.bytes;
  }

 private:
  struct Decl {
    uint64_t bytes;
    int dtype;
    int priority;
  };
  std::mutex mu_;
  std::unordered_map<Key, Decl> decl_;
};

/*
 * A worker's customer that pushes and pulls key-value pairs to and from the
 * servers (their KVServer of the same app_id). Val is a plain type (float,
 * double, int, char...).
 */
template <typename Val>
class KVWorker : public SimpleApp {
 public:
  using SimpleApp::obj_;
  /* Called once a push or pull has completed (on a thread of libfpt). */
  using Callback = std::function<void()>;

  explicit KVWorker(int app_id, int customer_id) : SimpleApp() {
    slicer_ = [this](const KVPairs<Val>& send, const std::vector<Range>& ranges, SlicedKVs* sliced) {
      DefaultSlicer(send, ranges, sliced);
    };
    Attach(app_id, customer_id);
    obj_->Open();
  }

  virtual ~KVWorker() { Detach(); }

  /* Pushes a copy of keys and vals (lens: elements per key, optional). */
  int Push(const std::vector<Key>& keys, const std::vector<Val>& vals, const std::vector<int>& lens = {},
           int cmd = 0, const Callback& cb = nullptr, int priority = 0) {
    return ZPush(SArray<Key>(keys), SArray<Val>(vals), SArray<int>(lens), cmd, cb, priority);
  }

  /* Pulls the keys' values into *vals (resized if empty), their lengths
   * into *lens if lens is given; ready when Wait returns or cb runs. */
  int Pull(const std::vector<Key>& keys, std::vector<Val>* vals, std::vector<int>* lens = nullptr, int cmd = 0,
           const Callback& cb = nullptr, int priority = 0) {
    SArray<Key> skeys(keys);
    int ts = AddPullCB(skeys, vals, lens, cb);
    KVPairs<Val> kvs;
    kvs.keys = skeys;
    kvs.priority = priority;
    Send(ts, false, true, cmd, kvs);
    return ts;
  }

  /* Pushes vals and pulls the results into *outs (resized if empty). */
  int PushPull(const std::vector<Key>& keys, const std::vector<Val>& vals, std::vector<Val>* outs,
               std::vector<int>* lens = nullptr, int cmd = 0, const Callback& cb = nullptr, int priority = 0) {
    CHECK_NOTNULL(outs);
    if (outs->empty()) {
      outs->resize(vals.size());
    } else {
      CHECK_EQ(vals.size(), outs->size()) << "KVWorker::PushPull: outs has another size than vals";
    }
    SArray<Key> skeys(keys);
    SArray<Val> svals(vals);
    // Views of the caller's vectors, which stay put until the pull is done.
    auto souts = new SArray<Val>(outs->data(), outs->size());
    SArray<int>* slens = lens ? new SArray<int>(lens->data(), lens->size()) : nullptr;
    return ZPushPull(skeys, svals, souts, slens, cmd,
                     [souts, slens, cb]() {
                       delete souts;
                       delete slens;
                       if (cb) cb();
                     },
                     priority);
  }

  /* Blocks until request timestamp has completed (its callback has run).
   * If the cluster fails first, the program ends with the reason. */
  void Wait(int timestamp) { obj_->WaitRequest(timestamp); }

  /* Push without copying: keys, vals and lens must stay unchanged until
   * the push completes. */
  int ZPush(const SArray<Key>& keys, const SArray<Val>& vals, const SArray<int>& lens = {}, int cmd = 0,
            const Callback& cb = nullptr, int priority = 0) {
    Postoffice::Get()->CheckRunning("KVWorker::ZPush");
    int ts = obj_->NewRequest(kServerGroup);
    AddCallback(ts, cb);
    KVPairs<Val> kvs;
    kvs.keys = keys;
    kvs.vals = vals;
    kvs.lens = lens;
    kvs.priority = priority;
    Send(ts, true, false, cmd, kvs);
    return ts;
  }

  /* Pull into *vals (resized if empty) without copying. */
  int ZPull(const SArray<Key>& keys, SArray<Val>* vals, SArray<int>* lens = nullptr, int cmd = 0,
            const Callback& cb = nullptr, int priority = 0) {
    int ts = AddPullCB(keys, vals, lens, cb);
    KVPairs<Val> kvs;
    kvs.keys = keys;
    kvs.priority = priority;
    Send(ts, false, true, cmd, kvs);
    return ts;
  }

  /* Push vals and pull the results into *outs, without copying. */
  int ZPushPull(const SArray<Key>& keys, const SArray<Val>& vals, SArray<Val>* outs, SArray<int>* lens = nullptr,
                int cmd = 0, const Callback& cb = nullptr, int priority = 0) {
    int ts = AddPullCB(keys, outs, lens, cb);
    KVPairs<Val> kvs;
    kvs.keys = keys;
    kvs.vals = vals;
    kvs.priority = priority;
    if (lens) kvs.lens = *lens;
    Send(ts, true, true, cmd, kvs);
    return ts;
  }

  using SlicedKVs = std::vector<std::pair<bool, KVPairs<Val>>>;
  /* Cuts send into one list per server (ranges[i]: server i's keys);
   * sliced[i].first says whether server i gets a message. */
  using Slicer =
      std::function<void(const KVPairs<Val>& send, const std::vector<Range>& ranges, SlicedKVs* sliced)>;

  void set_slicer(const Slicer& slicer) {
    CHECK(slicer) << "invalid slicer";
    slicer_ = slicer;
  }

  /*
   * fpt: FPTPush sends one iteration's values of the keys to fpt's
   * aggregation (fpt_push), which sums them over the workers; FPTPull
   * (fpt_pull) receives the sums. No KVServer takes part. Values are float
   * or double (or bytes, with set_fpt_dtype); lens are elements per key as
   * in ZPush (empty: vals.size()/keys.size() each). Every worker must
   * declare the same keys before any of them pushes: FPTPush declares an
   * undeclared key on its first push, which is enough only if every
   * worker's first push of it comes before any worker's second; else call
   * FPTDeclare for every key and a worker Barrier first. cmd is ignored
   * (fpt's aggregation takes none). keys, vals and lens must stay unchanged
   * until the request completes. Wait(ts) and cb as for ZPush.
   *
   * A key's first FPTPush is fpt's init round (iteration 0, as fpt_init):
   * only worker 0's values count, and the FPTPull after it gives every
   * worker worker 0's values. From the second on, FPTPull gives the sum
   * over the workers of the matching FPTPush. A key's n-th FPTPull gets its
   * n-th FPTPush's result, and must come after it.
   */
  int FPTPush(const SArray<Key>& keys, const SArray<Val>& vals, const SArray<int>& lens = {}, int cmd = 0,
              const Callback& cb = nullptr, int priority = 0) {
    (void)cmd;
    Postoffice::Get()->CheckRunning("KVWorker::FPTPush");
    std::vector<uint64_t> bytes = ByteLens(keys, vals.size(), lens, "KVWorker::FPTPush");
    int dtype = FptDtype("KVWorker::FPTPush");
    for (size_t i = 0; i < keys.size(); i++) {
      FptDeclarations::Get()->Ensure(keys[i], bytes[i], dtype, priority, "KVWorker::FPTPush");
    }
    int ts = obj_->NewRequestCount(1);
    FptRequest* req = new FptRequest{this, ts, cb, keys, vals};
    int64_t fts = 0;
    int st = fpt_push(keys.data(), keys.size(), vals.data(), bytes.data(), priority, &KVWorker::FptDone, req, &fts);
    if (st != FPT_OK) {
      delete req;
      LOG(FATAL) << "KVWorker::FPTPush: fpt_push: " << FptStatusName(st) << ": " << fpt_last_error();
    }
    return ts;
  }

  /* fpt: the sums of the keys' next unpulled iteration into *vals
   * (resized if empty), their lengths into *lens if given (resized if
   * empty; if not empty they give the lengths). A key's length is its
   * declared one. priority is the declared one's (fpt_pull takes none). */
  int FPTPull(const SArray<Key>& keys, SArray<Val>* vals, SArray<int>* lens = nullptr, int cmd = 0,
              const Callback& cb = nullptr, int priority = 0) {
    (void)cmd;
    (void)priority;
    Postoffice::Get()->CheckRunning("KVWorker::FPTPull");
    CHECK_NOTNULL(vals);
    std::vector<uint64_t> bytes(keys.size());
    size_t total = 0;
    bool given = lens && !lens->empty();
    if (given) {
      CHECK_EQ(lens->size(), keys.size()) << "KVWorker::FPTPull: lens and keys differ in size";
    }
    for (size_t i = 0; i < keys.size(); i++) {
      uint64_t declared = FptDeclarations::Get()->Bytes(keys[i]);
      CHECK_GT(declared, 0u) << "KVWorker::FPTPull: key " << keys[i]
                             << " was never pushed with FPTPush or declared with FPTDeclare by this process";
      if (given) {
        CHECK_EQ(uint64_t((*lens)[i]) * sizeof(Val), declared)
            << "KVWorker::FPTPull: lens[" << i << "] disagrees with key " << keys[i] << "'s declared size";
      }
      bytes[i] = declared;
      total += declared / sizeof(Val);
    }
    if (vals->empty()) {
      vals->resize(total);
    } else {
      CHECK_EQ(vals->size(), total) << "KVWorker::FPTPull: vals has room for " << vals->size()
                                    << " values, the keys hold " << total;
    }
    if (lens && lens->empty()) {
      lens->resize(keys.size());
      for (size_t i = 0; i < keys.size(); i++) (*lens)[i] = static_cast<int>(bytes[i] / sizeof(Val));
    }
    int ts = obj_->NewRequestCount(1);
    FptRequest* req = new FptRequest{this, ts, cb, keys, *vals};
    int64_t fts = 0;
    int st = fpt_pull(keys.data(), keys.size(), vals->data(), bytes.data(), &KVWorker::FptDone, req, &fts);
    if (st != FPT_OK) {
      delete req;
      LOG(FATAL) << "KVWorker::FPTPull: fpt_pull: " << FptStatusName(st) << ": " << fpt_last_error();
    }
    return ts;
  }

  /* fpt: declares the keys to fpt's aggregation (lens: elements per key),
   * as every worker must before any pushes with FPTPush. */
  void FPTDeclare(const SArray<Key>& keys, const SArray<int>& lens, int priority = 0) {
    Postoffice::Get()->CheckRunning("KVWorker::FPTDeclare");
    CHECK_EQ(keys.size(), lens.size()) << "KVWorker::FPTDeclare: keys and lens differ in size";
    int dtype = FptDtype("KVWorker::FPTDeclare");
    for (size_t i = 0; i < keys.size(); i++) {
      CHECK_GT(lens[i], 0) << "KVWorker::FPTDeclare: key " << keys[i] << " of length " << lens[i];
      FptDeclarations::Get()->Ensure(keys[i], uint64_t(lens[i]) * sizeof(Val), dtype, priority,
                                     "KVWorker::FPTDeclare");
    }
  }

  /* fpt: the element type FPTPush declares for values that are not float
   * or double (MXNet's KVWorker<char> carries any dtype as bytes). */
  void set_fpt_dtype(int dtype) { fpt_dtype_ = dtype; }

 private:
  /* An fpt_push / fpt_pull in flight; holds the arrays until it is done. */
  struct FptRequest {
    KVWorker* worker;
    int ts;
    Callback cb;
    SArray<Key> keys;
    SArray<Val> vals;
  };

  static void FptDone(int64_t /*fpt_ts*/, int status, void* user_data) {
    FptRequest* req = static_cast<FptRequest*>(user_data);
    if (status != FPT_OK) {
      std::string reason = std::string(FptStatusName(status)) + ": " + fpt_last_error();
      req->worker->obj_->Fail(reason);
      Postoffice::Get()->ClusterFailed("KVWorker::FPTPush/FPTPull", reason);
      delete req;
      return;
    }
    if (req->cb) req->cb();
    req->worker->obj_->AddResponse(req->ts);
    delete req;
  }

  int FptDtype(const char* what) const {
    int dtype = FptDtypeOf<Val>::value;
    if (dtype == 0) dtype = fpt_dtype_;
    CHECK_NE(dtype, 0) << what << ": values of this type are no fpt tensor: use float or double, or set_fpt_dtype";
    CHECK_EQ(sizeof(Val) == 1 || (dtype == FPT_FLOAT32 && sizeof(Val) == 4) ||
                 (dtype == FPT_FLOAT64 && sizeof(Val) == 8) ||
                 ((dtype == FPT_FLOAT16 || dtype == FPT_BFLOAT16) && sizeof(Val) == 2),
             true)
        << what << ": set_fpt_dtype(" << dtype << ") does not fit values of " << sizeof(Val) << " bytes";
    return dtype;
  }

  /* The byte length of each key's value (lens: elements per key, or empty
   * for equal lengths). */
  static std::vector<uint64_t> ByteLens(const SArray<Key>& keys, size_t num_vals, const SArray<int>& lens,
                                        const char* what) {
    std::vector<uint64_t> bytes(keys.size());
    if (keys.empty()) return bytes;
    if (lens.empty()) {
      size_t k = num_vals / keys.size();
      CHECK_EQ(k * keys.size(), num_vals) << what << ": " << num_vals << " values do not divide among "
                                          << keys.size() << " keys (give lens)";
      for (auto& b : bytes) b = k * sizeof(Val);
      return bytes;
    }
    CHECK_EQ(lens.size(), keys.size()) << what << ": lens and keys differ in size";
    size_t sum = 0;
    for (size_t i = 0; i < keys.size(); i++) {
      CHECK_GE(lens[i], 0) << what << ": lens[" << i << "] is negative";
      bytes[i] = uint64_t(lens[i]) * sizeof(Val);
      sum += size_t(lens[i]);
    }
    CHECK_EQ(sum, num_vals) << what << ": lens add up to " << sum << " values, vals has " << num_vals;
    return bytes;
  }

  template <typename C, typename D>
  int AddPullCB(const SArray<Key>& keys, C* vals, D* lens, const Callback& cb);

  void AddCallback(int timestamp, const Callback& cb) {
    if (!cb) return;
    std::lock_guard<std::mutex> lk(mu_);
    callbacks_[timestamp] = cb;
  }

  void RunCallback(int timestamp);
  void Send(int timestamp, bool push, bool pull, int cmd, const KVPairs<Val>& kvs);
  void Process(const Message& msg);
  void DefaultSlicer(const KVPairs<Val>& send, const std::vector<Range>& ranges, SlicedKVs* sliced);

  /* Pulled slices per timestamp, until the last is in. */
  std::unordered_map<int, std::vector<KVPairs<Val>>> recv_kvs_;
  std::unordered_map<int, Callback> callbacks_;
  std::mutex mu_;
  Slicer slicer_;
  int fpt_dtype_ = 0;
};

/* A KV request as a server sees it. */
struct KVMeta {
  int cmd;
  bool push;
  bool pull;
  /* The worker's node id. */
  int sender;
  int timestamp;
  /* The worker's customer. */
  int customer_id;
};

/* A server's customer of app_id: it handles the workers' push and pull
 * requests with the request handle, which answers each with Response. */
template <typename Val>
class KVServer : public SimpleApp {
 public:
  /* Requests that come before set_request_handle wait for it (libfpt
   * holds them, up to FPT_START_TIMEOUT). */
  explicit KVServer(int app_id) : SimpleApp() { Attach(app_id, app_id); }

  virtual ~KVServer() { Detach(); }

  using ReqHandle = std::function<void(const KVMeta& req_meta, const KVPairs<Val>& req_data, KVServer* server)>;
  /* Sets the handle and lets requests through to it; set it once: a
   * request being handled meanwhile would race with a second call. */
  void set_request_handle(const ReqHandle& request_handle) {
    CHECK(request_handle) << "invalid request handle";
    request_handle_ = request_handle;
    obj_->Open();
  }

  /* Answers request req with res (a pull's keys, vals and lens). */
  void Response(const KVMeta& req, const KVPairs<Val>& res = KVPairs<Val>());

 private:
  void Process(const Message& msg);
  ReqHandle request_handle_;
};

/*
 * A request handle that adds pushed values into a store and answers pulls
 * from it. ps-lite's handles values of one element; this one any length:
 * a key's value has the length of its first push (lens[i], or
 * vals.size()/keys.size() without lens), later pushes must agree. A pull
 * answers with lens when its keys' lengths differ, else without (every
 * key then has vals.size()/keys.size() values, which KVWorker reads as
 * lens). A key never pushed pulls as one 0.
 *
 * A request's keys in one piece: the first push of a key list none of whose
 * keys is stored yet keeps the list's values as one block (its keys, their
 * common length, the values end to end), and a later request of exactly
 * that list adds into or answers from the block as one array, with no work
 * per key (the classic path's usual case: every worker pushes and pulls the
 * same keys each iteration). A request of any other keys that meets a
 * block's key range breaks that block into store, one vector per key.
 */
template <typename Val>
struct KVServerDefaultHandle {
  void operator()(const KVMeta& req_meta, const KVPairs<Val>& req_data, KVServer<Val>* server) {
    size_t n = req_data.keys.size();
    KVPairs<Val> res;
    size_t k = 0;  // values per key when lens is empty
    if (req_meta.push && req_data.lens.empty() && n) {
      k = req_data.vals.size() / n;
      CHECK_EQ(k * n, req_data.vals.size()) << "KVServerDefaultHandle: values do not divide among the keys";
    }
    Block* b = n ? FindBlock(req_data.keys) : nullptr;
    if (req_meta.push) {
      size_t len = req_data.lens.empty() ? k : LensLength(req_data.lens);
      bool uniform = UniformLens(req_data.lens, len) && len * n == req_data.vals.size();
      if (b && uniform && len == b->k) {
        Val* dst = b->vals.data();
        const Val* src = req_data.vals.data();
        for (size_t j = 0, m = b->vals.size(); j < m; ++j) dst[j] += src[j];
      } else if (!b && n && uniform && NewBlock(req_data.keys)) {
        Block& nb = blocks_[req_data.keys.front()];
        nb.keys.assign(req_data.keys.begin(), req_data.keys.end());
        nb.k = len;
        nb.vals.assign(req_data.vals.begin(), req_data.vals.end());
        b = &nb;
      } else {
        if (b) Break(b);
        BreakRange(req_data.keys);
        PushEach(req_data);
        b = nullptr;
      }
    }
    if (req_meta.pull) {
      res.keys = req_data.keys;
      if (b) {
        // Response copies the values before it returns: a view of the
        // block will do.
        res.vals = SArray<Val>(b->vals.data(), b->vals.size(), false);
      } else {
        BreakRange(req_data.keys);
        PullEach(req_data.keys, &res);
      }
    }
    server->Response(req_meta, res);
  }
  std::unordered_map<Key, std::vector<Val>> store;

 private:
  struct Block {
    std::vector<Key> keys;
    size_t k = 0;  // values per key
    std::vector<Val> vals;
  };

  // The block whose keys are exactly keys, or null.
  Block* FindBlock(const SArray<Key>& keys) {
    auto it = blocks_.find(keys.front());
    if (it == blocks_.end()) return nullptr;
    Block& b = it->second;
    if (b.keys.size() != keys.size() || std::memcmp(b.keys.data(), keys.data(), keys.size() * sizeof(Key)) != 0) {
      return nullptr;
    }
    return &b;
  }
  static size_t LensLength(const SArray<int>& lens) { return lens.empty() ? 0 : size_t(lens[0]); }
  // Whether lens is empty or every length is k.
  static bool UniformLens(const SArray<int>& lens, size_t k) {
    for (int l : lens) {
      if (size_t(l) != k) return false;
    }
    return true;
  }
  // Whether keys (ascending) may become a block: no block's range meets
  // theirs and none of them is in store.
  bool NewBlock(const SArray<Key>& keys) {
    auto it = blocks_.upper_bound(keys.back());
    if (it != blocks_.begin() && std::prev(it)->second.keys.back() >= keys.front()) return false;
    if (store.empty()) return true;
    for (Key key : keys) {
      if (store.count(key)) return false;
    }
    return true;
  }
  // Moves block b into store, one vector per key.
  void Break(Block* b) {
    for (size_t i = 0; i < b->keys.size(); ++i) {
      store[b->keys[i]].assign(b->vals.begin() + i * b->k, b->vals.begin() + (i + 1) * b->k);
    }
    blocks_.erase(b->keys.front());
  }
  // Breaks every block whose key range meets keys' (ascending).
  void BreakRange(const SArray<Key>& keys) {
    if (keys.empty()) return;
    auto it = blocks_.upper_bound(keys.back());
    while (it != blocks_.begin()) {
      --it;
      if (it->second.keys.back() < keys.front()) break;
      Block* b = &it->second;
      it = std::next(it);  // Break erases b
      Break(b);
      it = blocks_.upper_bound(keys.back());
    }
  }
  void PushEach(const KVPairs<Val>& req_data) {
    size_t n = req_data.keys.size();
    size_t k = 0;
    if (req_data.lens.empty() && n) k = req_data.vals.size() / n;
    size_t off = 0;
    for (size_t i = 0; i < n; ++i) {
      size_t len = req_data.lens.empty() ? k : size_t(req_data.lens[i]);
      CHECK_LE(off + len, req_data.vals.size()) << "KVServerDefaultHandle: lens exceed vals";
      std::vector<Val>& v = store[req_data.keys[i]];
      if (v.empty()) v.resize(len);
      CHECK_EQ(v.size(), len) << "KVServerDefaultHandle: key " << req_data.keys[i] << " was pushed with " << v.size()
                              << " values, now " << len;
      for (size_t j = 0; j < len; ++j) v[j] += req_data.vals[off + j];
      off += len;
    }
    CHECK_EQ(off, req_data.vals.size()) << "KVServerDefaultHandle: lens add up to less than vals";
  }
  void PullEach(const SArray<Key>& keys, KVPairs<Val>* res) {
    size_t n = keys.size();
    std::vector<const std::vector<Val>*> found(n);
    res->lens.resize_uninitialized(n);
    size_t total = 0;
    bool uniform = true;
    for (size_t i = 0; i < n; ++i) {
      auto it = store.find(keys[i]);
      found[i] = it == store.end() ? nullptr : &it->second;
      size_t len = found[i] ? found[i]->size() : 1;
      res->lens[i] = static_cast<int>(len);
      uniform = uniform && res->lens[i] == res->lens[0];
      total += len;
    }
    res->vals.resize_uninitialized(total);
    size_t off = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!found[i]) {
        res->vals[off++] = Val();
        continue;
      }
      std::copy(found[i]->begin(), found[i]->end(), res->vals.data() + off);
      off += found[i]->size();
    }
    if (uniform) res->lens.clear();
  }

  // By first key.
  std::map<Key, Block> blocks_;
};

////////////////////////////////////////////////////////////////////////////

template <typename Val>
void KVServer<Val>::Process(const Message& msg) {
  if (msg.meta.simple_app) {
    SimpleApp::Process(msg);
    return;
  }
  KVMeta meta;
  meta.cmd = msg.meta.head;
  meta.push = msg.meta.push;
  meta.pull = msg.meta.pull;
  meta.sender = msg.meta.sender;
  meta.timestamp = msg.meta.timestamp;
  meta.customer_id = msg.meta.customer_id;
  KVPairs<Val> data;
  size_t n = msg.data.size();
  if (n) {
    CHECK_GE(n, 2u) << "KVServer: a request from node " << meta.sender << " with " << n << " data segment";
    CHECK_LE(n, 3u) << "KVServer: a request from node " << meta.sender << " with " << n << " data segments";
    data.keys = msg.data[0];
    data.vals = msg.data[1];
    if (n > 2) {
      data.lens = msg.data[2];
      CHECK_EQ(data.lens.size(), data.keys.size()) << "KVServer: a request whose lens and keys differ in size";
    }
  }
  request_handle_(meta, data, this);
}

template <typename Val>
void KVServer<Val>::Response(const KVMeta& req, const KVPairs<Val>& res) {
  Message msg;
  msg.meta.app_id = obj_->app_id();
  msg.meta.customer_id = req.customer_id;
  msg.meta.request = false;
  msg.meta.push = req.push;
  msg.meta.pull = req.pull;
  msg.meta.head = req.cmd;
  msg.meta.timestamp = req.timestamp;
  msg.meta.recver = req.sender;
  msg.meta.priority = res.priority;
  msg.meta.dtype = FptDtypeOf<Val>::value;
  if (res.keys.size()) {
    msg.AddData(res.keys);
    msg.AddData(res.vals);
    if (res.lens.size()) msg.AddData(res.lens);
  }
  Postoffice::Get()->van()->Send(msg);
}

template <typename Val>
void KVWorker<Val>::DefaultSlicer(const KVPairs<Val>& send, const std::vector<Range>& ranges,
                                  SlicedKVs* sliced) {
  size_t n = ranges.size();
  sliced->resize(n);
  // pos[i]: the first key of server i's slice.
  std::vector<size_t> pos(n + 1, 0);
  const Key* begin = send.keys.begin();
  const Key* end = send.keys.end();
  for (size_t i = 1; i < send.keys.size(); i++) {
    CHECK_LT(send.keys[i - 1], send.keys[i]) << "keys must be unique and ascending";
  }
  for (size_t i = 0; i < n; ++i) {
    if (i == 0) {
      pos[0] = std::lower_bound(begin, end, ranges[0].begin()) - begin;
      CHECK_EQ(pos[0], 0u) << "key " << send.keys[0] << " is below every server's range";
    } else {
      CHECK_EQ(ranges[i - 1].end(), ranges[i].begin()) << "the server key ranges must be contiguous";
    }
    pos[i + 1] = std::lower_bound(begin, end, ranges[i].end()) - begin;
    if (i + 1 == n) {
      // The last range ends at kMaxKey (exclusive); kMaxKey itself goes
      // to the last server.
      pos[i + 1] = send.keys.size();
    }
  }
  for (size_t i = 0; i < n; ++i) (*sliced)[i].first = false;
  if (send.keys.empty()) return;

  size_t k = 0;
  if (send.lens.empty()) {
    k = send.vals.size() / send.keys.size();
    CHECK_EQ(k * send.keys.size(), send.vals.size())
        << send.vals.size() << " values do not divide among " << send.keys.size() << " keys (give lens)";
  } else {
    CHECK_EQ(send.keys.size(), send.lens.size()) << "lens and keys differ in size";
    size_t sum = 0;
    for (int l : send.lens) {
      CHECK_GE(l, 0) << "a negative length in lens";
      sum += size_t(l);
    }
    CHECK_EQ(sum, send.vals.size()) << "lens add up to " << sum << " values, vals has " << send.vals.size();
  }

  size_t val_begin = 0;
  for (size_t i = 0; i < n; ++i) {
    if (pos[i + 1] == pos[i]) continue;
    (*sliced)[i].first = true;
    KVPairs<Val>& kv = (*sliced)[i].second;
    kv.keys = send.keys.segment(pos[i], pos[i + 1]);
    if (send.lens.size()) {
      kv.lens = send.lens.segment(pos[i], pos[i + 1]);
      size_t val_end = val_begin;
      for (int l : kv.lens) val_end += size_t(l);
      kv.vals = send.vals.segment(val_begin, val_end);
      val_begin = val_end;
    } else if (send.vals.size()) {
      kv.vals = send.vals.segment(pos[i] * k, pos[i + 1] * k);
    }
  }
}

template <typename Val>
void KVWorker<Val>::Send(int timestamp, bool push, bool pull, int cmd, const KVPairs<Val>& kvs) {
  Postoffice* po = Postoffice::Get();
  po->CheckRunning(push ? (pull ? "KVWorker::PushPull" : "KVWorker::Push") : "KVWorker::Pull");
  CHECK(po->is_worker()) << "KVWorker requests come from workers only";
  SlicedKVs sliced;
  slicer_(kvs, po->GetServerKeyRanges(), &sliced);
  CHECK_EQ(sliced.size(), static_cast<size_t>(po->num_servers())) << "the slicer made a list per server";

  int skipped = 0;
  for (const auto& s : sliced) {
    if (!s.first) ++skipped;
  }
  if (static_cast<size_t>(skipped) == sliced.size()) {
    // Nothing to send: done at once (the callback before Wait returns).
    RunCallback(timestamp);
    obj_->AddResponse(timestamp, skipped);
    return;
  }
  // Counted before any response can come: Process completes the request
  // at the last server's response.
  obj_->AddResponse(timestamp, skipped);

  for (size_t i = 0; i < sliced.size(); ++i) {
    const auto& s = sliced[i];
    if (!s.first) continue;
    Message msg;
    msg.meta.app_id = obj_->app_id();
    msg.meta.customer_id = obj_->customer_id();
    msg.meta.request = true;
    msg.meta.push = push;
    msg.meta.pull = pull;
    msg.meta.head = cmd;
    msg.meta.timestamp = timestamp;
    msg.meta.recver = Postoffice::ServerRankToID(static_cast<int>(i));
    msg.meta.priority = kvs.priority;
    msg.meta.dtype = FptDtypeOf<Val>::value;
    const KVPairs<Val>& slice = s.second;
    if (slice.keys.size()) {
      msg.AddData(slice.keys);
      msg.AddData(slice.vals);
      if (slice.lens.size()) msg.AddData(slice.lens);
    }
    po->van()->Send(msg);
  }
}

template <typename Val>
void KVWorker<Val>::Process(const Message& msg) {
  if (msg.meta.simple_app) {
    SimpleApp::Process(msg);
    return;
  }
  int ts = msg.meta.timestamp;
  if (msg.meta.pull) {
    CHECK_GE(msg.data.size(), 2u) << "KVWorker: a pull response from node " << msg.meta.sender << " without values";
    KVPairs<Val> kvs;
    kvs.keys = msg.data[0];
    kvs.vals = msg.data[1];
    if (msg.data.size() > 2) kvs.lens = msg.data[2];
    std::lock_guard<std::mutex> lk(mu_);
    recv_kvs_[ts].push_back(kvs);
  }
  // The customer counts this response after Process returns: this is the
  // last one when all the others are in.
  if (obj_->NumResponse(ts) == Postoffice::Get()->num_servers() - 1) RunCallback(ts);
}

template <typename Val>
void KVWorker<Val>::RunCallback(int timestamp) {
  Callback cb;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = callbacks_.find(timestamp);
    if (it == callbacks_.end()) return;
    cb = it->second;
    callbacks_.erase(it);
  }
  cb();
}

template <typename Val>
template <typename C, typename D>
int KVWorker<Val>::AddPullCB(const SArray<Key>& keys, C* vals, D* lens, const Callback& cb) {
  Postoffice::Get()->CheckRunning("KVWorker::Pull");
  CHECK_NOTNULL(vals);
  int ts = obj_->NewRequest(kServerGroup);
  AddCallback(ts, [this, ts, keys, vals, lens, cb]() mutable {
    std::vector<KVPairs<Val>> kvs;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = recv_kvs_.find(ts);
      if (it != recv_kvs_.end()) {
        kvs.swap(it->second);
        recv_kvs_.erase(it);
      }
    }
    size_t total_key = 0, total_val = 0;
    for (const auto& s : kvs) {
      CHECK(!s.keys.empty()) << "a pull response without keys";
      Range range = FindRange(keys, s.keys.front(), s.keys.back() + 1);
      CHECK_EQ(range.size(), s.keys.size()) << "unmatched keys size from one server";
      if (lens && s.lens.size()) CHECK_EQ(s.lens.size(), s.keys.size()) << "a server's pull answer has lens for another number of keys";
      total_key += s.keys.size();
      total_val += s.vals.size();
    }
    CHECK_EQ(total_key, keys.size()) << "lost some servers?";
    std::sort(kvs.begin(), kvs.end(),
              [](const KVPairs<Val>& a, const KVPairs<Val>& b) { return a.keys.front() < b.keys.front(); });
    bool fill = true;
    if (vals->empty()) {
      // One server's answer is the pull's values as they are (an SArray
      // takes them over); else room for them, unset until copied in.
      fill = !(kvs.size() == 1 && internal::TakeOver(vals, kvs[0].vals));
      if (fill) internal::ResizeForCopy(vals, total_val);
    } else {
      CHECK_EQ(vals->size(), total_val) << "the pull's vals have room for " << vals->size() << " values, the servers sent "
                                        << total_val;
    }
    Val* p_vals = vals->data();
    int* p_lens = nullptr;
    if (lens) {
      if (lens->empty()) {
        internal::ResizeForCopy(lens, keys.size());
      } else {
        CHECK_EQ(lens->size(), keys.size()) << "the pull's lens have another size than its keys";
      }
      p_lens = lens->data();
    }
    for (const auto& s : kvs) {
      if (fill && s.vals.size()) std::memcpy(p_vals, s.vals.data(), s.vals.size() * sizeof(Val));
      p_vals += s.vals.size();
      if (p_lens) {
        if (s.lens.size()) {
          std::memcpy(p_lens, s.lens.data(), s.lens.size() * sizeof(int));
        } else {
          // No lens: every key has the same number of values.
          size_t k = s.vals.size() / s.keys.size();
          CHECK_EQ(k * s.keys.size(), s.vals.size()) << "a pull response's values do not divide among its keys";
          std::fill(p_lens, p_lens + s.keys.size(), static_cast<int>(k));
        }
        p_lens += s.keys.size();
      }
    }
    if (cb) cb();
  });
  return ts;
}

}  // namespace ps
#endif  // PS_KV_APP_H_
