/*
 * ps/base.h - keys and node groups of ps-lite's interface, on fpt.
 *
 * include/ps/ is ps-lite's public C++ interface written over fpt's C
 * library (fpt.h): a program written against ps-lite builds unchanged with
 * this directory on its include path and links libfpt
 * (pkg-config --cflags --libs fpt). Header-only; C++11.
 */
#ifndef PS_BASE_H_
#define PS_BASE_H_

#include <cstdint>
#include <limits>

#include "ps/internal/utils.h"

namespace ps {

/* Keys are 64-bit (fpt has no USE_KEY32 build). */
using Key = uint64_t;
/* The largest key. */
static const Key kMaxKey = std::numeric_limits<Key>::max();
/* The scheduler's node id. */
static const int kScheduler = 1;
/* The servers' group id; groups combine with + or |. */
static const int kServerGroup = 2;
/* The workers' group id. */
static const int kWorkerGroup = 4;

}  // namespace ps
#endif  // PS_BASE_H_
