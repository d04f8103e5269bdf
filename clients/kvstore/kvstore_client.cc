// kvstore_client drives libfpt the way MXNet's kvstore_dist drives the
// parameter server (in FPT's version of it, which calls FPTPush/FPTPull
// instead of ps-lite's ZPush/ZPull):
//
//   - every process starts a node from the DMLC_* environment; the
//     scheduler and servers only serve until the workers finalize (as
//     KVStoreDist does for them), so this program can run as any role;
//   - a worker announces the number of tensors per iteration and declares
//     every parameter (key = its index, priority = -layer index), then
//     initialises the weights: worker 0's values win on every worker;
//   - each iteration, the backward pass pushes every layer's gradient, last
//     layer first, asynchronously with a completion callback, and the
//     forward pass pulls every sum into its own buffer (every second
//     iteration, one fpt_push_pull per layer does both); the worker waits
//     for all of them and checks every element exactly.
//
// Values are small integers, exact in float32 whatever the order of
// addition, so a single wrong element is a real bug. It prints a PASS line
// with the push+pull goodput (bytes pushed and pulled over the time spent
// communicating) and exits non-zero on any mismatch or failure.
//
//   kvstore_client [-iters N] [-tensors T] [-min-bytes B] [-max-bytes B] [-quiet]

#include <fpt.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {


// die ends the process at once. _Exit skips atexit handlers, which would
// tear down ZeroMQ under the library's running threads; the cluster's
// other nodes notice this one is gone.
[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "kvstore_client: %s\n", msg.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

void check(int status, const char* call) {
  if (status != FPT_OK) {
    die(std::string(call) + ": " + fpt_status_name(status) + ": " + fpt_last_error());
  }
}

struct Options {
  int iters = 10;
  int tensors = 8;
  uint64_t min_bytes = 4 << 10;
  uint64_t max_bytes = 16 << 20;
  bool quiet = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) die("flag " + a + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "-help" || a == "--help") {
      std::printf(
          "usage: kvstore_client [-iters N] [-tensors T] [-min-bytes B] [-max-bytes B] [-quiet]\n\n"
          "Drives libfpt as MXNet's kvstore_dist does, in whichever role DMLC_ROLE names,\n"
          "and checks every pulled value exactly.\n\n"
          "Flags:\n"
          "  -iters N       training iterations after init (default 10)\n"
          "  -tensors T     tensors per iteration (default 8)\n"
          "  -min-bytes B   smallest tensor in bytes (default 4096)\n"
          "  -max-bytes B   largest tensor in bytes (default 16777216)\n"
          "  -quiet         no line per iteration\n\n"
          "Environment: the node's, as for every fpt node (DMLC_ROLE, DMLC_PS_ROOT_URI,\n"
          "DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER, ...): bin/fpt -h lists them all.\n");
      std::exit(0);
    }
    if (a == "-iters") o.iters = std::atoi(next());
    else if (a == "-tensors") o.tensors = std::atoi(next());
    else if (a == "-min-bytes") o.min_bytes = std::strtoull(next(), nullptr, 10);
    else if (a == "-max-bytes") o.max_bytes = std::strtoull(next(), nullptr, 10);
    else if (a == "-quiet") o.quiet = true;
    else die("unknown flag " + a + " (-iters N -tensors T -min-bytes B -max-bytes B -quiet)");
  }
  if (o.iters < 0 || o.tensors < 1 || o.min_bytes < 4 || o.max_bytes < o.min_bytes) {
    die("bad flags: need iters >= 0, tensors >= 1, 4 <= min-bytes <= max-bytes");
  }
  return o;
}

// value is the gradient element j of key on worker rank at iteration iter
// (iteration 0: the initial weight): a small integer.
float value(int rank, int iter, uint64_t key, uint64_t j) {
  return float((uint64_t(rank) * 7 + uint64_t(iter) * 13 + key % 97 * 3 + j) % 61);
}

// expected is what a pull must return: worker 0's weight at iteration 0
// (init), else the sum of every worker's gradient.
float expected(int workers, int iter, uint64_t key, uint64_t j) {
  if (iter == 0) return value(0, 0, key, j);
  float s = 0;
  for (int r = 0; r < workers; r++) s += value(r, iter, key, j);
  return s;
}

// A parameter of the model, as kvstore_dist sees one NDArray per key.
struct Tensor {
  uint64_t key;
  uint64_t bytes;
  uint64_t elems;
  int priority;
  float* weight;  // views into the arenas below
  float* grad;
  float* sum;
};

// Counts the completions the library reports through callbacks.
struct Completions {
  std::atomic<int> pushes{0};
  std::atomic<int> pulls{0};
  std::atomic<int> failures{0};
};

void on_push(int64_t ts, int status, void* user) {
  auto* c = static_cast<Completions*>(user);
  if (status != FPT_OK) {
    std::fprintf(stderr, "kvstore_client: push %lld: %s: %s\n", static_cast<long long>(ts), fpt_status_name(status),
                 fpt_last_error());
    c->failures++;
  }
  c->pushes++;
}

void on_pull(int64_t ts, int status, void* user) {
  auto* c = static_cast<Completions*>(user);
  if (status != FPT_OK) {
    std::fprintf(stderr, "kvstore_client: pull %lld: %s: %s\n", static_cast<long long>(ts), fpt_status_name(status),
                 fpt_last_error());
    c->failures++;
  }
  c->pulls++;
}

// verify compares every element of the tensors' buffers (weights at
// iteration 0, sums after) with the expected values.
uint64_t verify(const std::vector<Tensor>& model, int workers, int iter, const char* what) {
  uint64_t checked = 0;
  for (const Tensor& t : model) {
    const float* got = iter == 0 ? t.weight : t.sum;
    for (uint64_t j = 0; j < t.elems; j++) {
      float want = expected(workers, iter, t.key, j);
      if (got[j] != want) {
        die(std::string(what) + ": key " + std::to_string(t.key) + " element " + std::to_string(j) + " = " +
            std::to_string(got[j]) + ", want " + std::to_string(want));
      }
    }
    checked += t.elems;
  }
  return checked;
}

std::string human(uint64_t b) {
  char buf[32];
  if (b >= (1u << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / (1 << 20));
  else if (b >= (1u << 10)) std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / (1 << 10));
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

int train(const Options& o) {
  int rank = 0, workers = 0;
  check(fpt_rank(&rank), "fpt_rank");
  check(fpt_num_workers(&workers), "fpt_num_workers");

  // Layer sizes grow geometrically from min-bytes to max-bytes, as in fpt's
  // Go trainer (test_kv_app), so that the two measure the same model.
  std::vector<Tensor> model(o.tensors);
  uint64_t total = 0, model_bytes = 0;
  for (int i = 0; i < o.tensors; i++) {
    double b = double(o.min_bytes);
    if (o.tensors > 1) b *= std::pow(double(o.max_bytes) / double(o.min_bytes), double(i) / (o.tensors - 1));
    Tensor& t = model[i];
    t.key = uint64_t(i);
    t.elems = uint64_t(b) / sizeof(float);
    t.bytes = t.elems * sizeof(float);
    t.priority = -i;  // MXNet: earlier layers are needed first
    total += t.elems;
    model_bytes += t.bytes;
  }
  std::vector<float> weights(total), grads(total), sums(total);
  uint64_t off = 0;
  for (Tensor& t : model) {
    t.weight = weights.data() + off;
    t.grad = grads.data() + off;
    t.sum = sums.data() + off;
    off += t.elems;
  }

  // kvstore Init: the number of parameters is known here; announce it,
  // declare them, then init (worker 0's values win).
  check(fpt_set_tensors_per_iteration(o.tensors), "fpt_set_tensors_per_iteration");
  std::vector<uint64_t> keys, lens;
  for (const Tensor& t : model) {
    check(fpt_declare(t.key, t.bytes, FPT_FLOAT32, t.priority), "fpt_declare");
    keys.push_back(t.key);
    lens.push_back(t.bytes);
  }
  for (const Tensor& t : model) {
    for (uint64_t j = 0; j < t.elems; j++) t.weight[j] = value(rank, 0, t.key, j);
  }
  check(fpt_init(keys.data(), keys.size(), weights.data(), lens.data()), "fpt_init");
  uint64_t checked = verify(model, workers, 0, "init");
  std::printf("worker %d: init: %d tensors, %s, every value is worker 0's\n", rank, o.tensors,
              human(model_bytes).c_str());

  double seconds = 0;
  for (int it = 1; it <= o.iters; it++) {
    for (const Tensor& t : model) {
      for (uint64_t j = 0; j < t.elems; j++) t.grad[j] = value(rank, it, t.key, j);
    }
    Completions done;
    std::vector<int64_t> requests;
    // Only the communication is timed, as in the Go trainer.
    auto t0 = std::chrono::steady_clock::now();
    // Even iterations push and pull each key in one request (fpt_push_pull,
    // its callback counted as a pull's), odd ones as MXNet's kvstore does.
    const bool one_request = it % 2 == 0;
    if (one_request) {
      for (int i = o.tensors - 1; i >= 0; i--) {
        const Tensor& t = model[i];
        int64_t ts = 0;
        check(fpt_push_pull(&t.key, 1, t.grad, t.sum, &t.bytes, t.priority, on_pull, &done, &ts), "fpt_push_pull");
        requests.push_back(ts);
      }
    } else {
      // Backward pass: gradients appear last layer first; each is pushed
      // as soon as it is ready (kvstore_dist's PushImpl, one ZPush per key).
      for (int i = o.tensors - 1; i >= 0; i--) {
        const Tensor& t = model[i];
        int64_t ts = 0;
        check(fpt_push(&t.key, 1, t.grad, &t.bytes, t.priority, on_push, &done, &ts), "fpt_push");
        requests.push_back(ts);
      }
      // Forward pass of the next iteration: pull every sum into its own
      // buffer (PullImpl, one ZPull per key), first layer first.
      for (const Tensor& t : model) {
        int64_t ts = 0;
        check(fpt_pull(&t.key, 1, t.sum, &t.bytes, on_pull, &done, &ts), "fpt_pull");
        requests.push_back(ts);
      }
    }
    for (int64_t ts : requests) check(fpt_wait(ts), "fpt_wait");
    double d = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    seconds += d;
    // fpt_wait returns after the request's callback: every one has run.
    const int want_pushes = one_request ? 0 : o.tensors;
    if (done.pushes != want_pushes || done.pulls != o.tensors || done.failures != 0) {
      die("iteration " + std::to_string(it) + ": callbacks: " + std::to_string(done.pushes.load()) + " pushes, " +
          std::to_string(done.pulls.load()) + " pulls, " + std::to_string(done.failures.load()) + " failed; want " +
          std::to_string(want_pushes) + " and " + std::to_string(o.tensors));
    }
    checked += verify(model, workers, it, ("iteration " + std::to_string(it)).c_str());
    check(fpt_barrier(), "fpt_barrier");
    if (!o.quiet) {
      std::printf("worker %d: iteration %d/%d verified: %d tensors, %s pushed and pulled in %.3f s (%.2f Gbit/s)\n",
                  rank, it, o.iters, o.tensors, human(2 * model_bytes).c_str(), d,
                  2.0 * double(model_bytes) * 8 / d / 1e9);
      std::fflush(stdout);
    }
  }
  double gbps = seconds > 0 ? 2.0 * double(model_bytes) * o.iters * 8 / seconds / 1e9 : 0;
  std::printf("worker %d: PASS: %d iterations x %d tensors (%s per iteration), %llu values checked exactly; "
              "goodput %.2f Gbit/s\n",
              rank, o.iters, o.tensors, human(model_bytes).c_str(), static_cast<unsigned long long>(checked), gbps);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  // As MXNet asks IsWorkerNode() before it starts ps-lite: the role comes
  // from DMLC_ROLE before fpt_start.
  int role = 0;
  check(fpt_role(&role), "fpt_role");
  check(fpt_start(), "fpt_start");
  if (role == FPT_ROLE_WORKER) {
    train(o);
  }
  // A worker leaves after its requests; the scheduler and servers serve
  // here until every worker has left.
  check(fpt_finalize(), "fpt_finalize");
  if (role != FPT_ROLE_WORKER) {
    std::printf("%s: done\n", role == FPT_ROLE_SCHEDULER ? "scheduler" : "server");
  }
  return 0;
}
