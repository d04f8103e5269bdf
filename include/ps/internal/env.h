/*
 * ps/internal/env.h - ps::Environment: the DMLC_* / PS_* settings.
 *
 * find(k) returns a value given to Init, else getenv(k). fpt's library
 * reads its settings with getenv when ps::Start runs, so Init also puts
 * its values into the process environment (setenv, overwriting): values
 * given to Init before Start configure the node, as in ps-lite.
 */
#ifndef PS_INTERNAL_ENV_H_
#define PS_INTERNAL_ENV_H_

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace ps {

class Environment {
 public:
  static inline Environment* Get() { return _GetSharedRef(nullptr).get(); }
  static inline std::shared_ptr<Environment> _GetSharedRef() { return _GetSharedRef(nullptr); }
  static inline Environment* Init(const std::unordered_map<std::string, std::string>& envs) {
    Environment* env = _GetSharedRef(&envs).get();
    std::lock_guard<std::mutex> lk(env->mu_);
    env->kvs_ = envs;
    for (const auto& kv : envs) setenv(kv.first.c_str(), kv.second.c_str(), 1);
    return env;
  }

  /* The value of k, or nullptr if it is not set. */
  const char* find(const char* k) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = kvs_.find(k);
    return it == kvs_.end() ? getenv(k) : it->second.c_str();
  }

 private:
  explicit Environment(const std::unordered_map<std::string, std::string>* envs) {
    if (envs) kvs_ = *envs;
  }
  static std::shared_ptr<Environment> _GetSharedRef(const std::unordered_map<std::string, std::string>* envs) {
    static std::shared_ptr<Environment> inst(new Environment(envs));
    return inst;
  }

  std::mutex mu_;
  std::unordered_map<std::string, std::string> kvs_;
};

}  // namespace ps
#endif  // PS_INTERNAL_ENV_H_
