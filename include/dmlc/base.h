/*
 * dmlc/base.h - the little of dmlc-core's base.h that ps-lite programs use,
 * for fpt's ps-lite headers (include/ps/).
 *
 * The include guard is dmlc-core's own: a program that has dmlc-core on its
 * include path before fpt's include/ (MXNet does) gets dmlc-core's header,
 * and if dmlc-core's was included first this one is skipped.
 */
#ifndef DMLC_BASE_H_
#define DMLC_BASE_H_

#ifndef DMLC_USE_CXX11
#define DMLC_USE_CXX11 1
#endif

#ifndef DMLC_LOG_STACK_TRACE
#define DMLC_LOG_STACK_TRACE 0
#endif

#ifndef DMLC_ATTRIBUTE_UNUSED
#define DMLC_ATTRIBUTE_UNUSED __attribute__((unused))
#endif

#ifndef DISALLOW_COPY_AND_ASSIGN
#define DISALLOW_COPY_AND_ASSIGN(T) \
  T(const T&) = delete;             \
  T& operator=(const T&) = delete
#endif

#endif  // DMLC_BASE_H_
