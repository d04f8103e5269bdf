/*
 * ps/internal/utils.h - ps-lite's small helpers: GetEnv, LL, the logging
 * macros (dmlc/logging.h).
 */
#ifndef PS_INTERNAL_UTILS_H_
#define PS_INTERNAL_UTILS_H_

#include <cinttypes>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "dmlc/logging.h"
#include "ps/internal/env.h"

namespace ps {

/* The setting key (Environment::find), else default_val. */
template <typename V>
inline V GetEnv(const char* key, V default_val) {
  const char* val = Environment::Get()->find(key);
  return val == nullptr ? default_val : V(val);
}

inline int GetEnv(const char* key, int default_val) {
  const char* val = Environment::Get()->find(key);
  return val == nullptr ? default_val : atoi(val);
}

#ifndef DISALLOW_COPY_AND_ASSIGN
#define DISALLOW_COPY_AND_ASSIGN(T) \
  T(const T&) = delete;             \
  T& operator=(const T&) = delete
#endif

#define LL LOG(ERROR)

}  // namespace ps
#endif  // PS_INTERNAL_UTILS_H_
