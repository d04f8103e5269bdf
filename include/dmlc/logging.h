/*
 * dmlc/logging.h - the logging and check macros ps-lite programs use
 * (dmlc-core's LOG, CHECK, CHECK_EQ, CHECK_NOTNULL, DCHECK, LOG_IF), for
 * fpt's ps-lite headers (include/ps/).
 *
 * The include guard is dmlc-core's own: a program that has dmlc-core on its
 * include path before fpt's include/ (MXNet does) gets dmlc-core's header,
 * and if dmlc-core's was included first this one is skipped. fpt's
 * include/ps/ uses only macros both provide.
 *
 * LOG(FATAL) and a failed CHECK print "[hh:mm:ss] file:line: message" on
 * stderr and end the process with status 1 (std::_Exit, after flushing
 * stdout and stderr). They do not throw: a check can fail on a thread of
 * libfpt (a customer's handler, a request's callback), which an exception
 * must not unwind, and atexit handlers would tear down state that the
 * library's threads still use. LOG(INFO), LOG(WARNING) and LOG(ERROR)
 * print the same way and return.
 */
#ifndef DMLC_LOGGING_H_
#define DMLC_LOGGING_H_

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dmlc/base.h"

namespace dmlc {

/* dmlc-core's exception type; fpt's LOG(FATAL) does not throw it, but
 * programs may name it. */
struct Error : public std::runtime_error {
  explicit Error(const std::string& s) : std::runtime_error(s) {}
};

/* dmlc-core's InitLogging: nothing to set up here. */
inline void InitLogging(const char* /*argv0*/) {}

namespace logging_detail {

inline std::mutex& OutputMutex() {
  static std::mutex mu;
  return mu;
}

/* Writes one whole line to stderr (lines of different threads do not mix). */
inline void Emit(const std::string& line) {
  std::lock_guard<std::mutex> lk(OutputMutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

inline std::string Prefix(const char* file, int line) {
  std::time_t now = std::time(nullptr);
  std::tm tm_now;
  localtime_r(&now, &tm_now);
  char buf[32];
  std::snprintf(buf, sizeof buf, "[%02d:%02d:%02d] ", tm_now.tm_hour, tm_now.tm_min, tm_now.tm_sec);
  std::ostringstream os;
  os << buf << file << ":" << line << ": ";
  return os.str();
}

}  // namespace logging_detail

class LogMessage {
 public:
  LogMessage(const char* file, int line) { os_ << logging_detail::Prefix(file, line); }
  ~LogMessage() {
    os_ << '\n';
    logging_detail::Emit(os_.str());
  }
  std::ostringstream& stream() { return os_; }

 private:
  std::ostringstream os_;
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
};

class LogMessageFatal {
 public:
  LogMessageFatal(const char* file, int line) { os_ << logging_detail::Prefix(file, line); }
  [[noreturn]] ~LogMessageFatal() {
    os_ << '\n';
    std::fflush(stdout);
    logging_detail::Emit(os_.str());
    std::_Exit(1);
  }
  std::ostringstream& stream() { return os_; }

 private:
  std::ostringstream os_;
  LogMessageFatal(const LogMessageFatal&) = delete;
  LogMessageFatal& operator=(const LogMessageFatal&) = delete;
};

/* Turns "cond ? (void)0 : stream << ..." into a void expression. */
struct LogMessageVoidify {
  void operator&(std::ostream&) {}
};

/* The result of a CHECK_xx comparison: null when it holds, else the values. */
typedef std::unique_ptr<std::string> LogCheckError;

/* The comparisons may compare signed and unsigned values, as dmlc-core's
 * do; the caller's -Wsign-compare is not ours to raise here. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#define DMLC_FPT_DEFINE_CHECK_FUNC(name, op)                                  \
  template <typename X, typename Y>                                          \
  inline LogCheckError LogCheck##name(const X& x, const Y& y) {              \
    if (x op y) return LogCheckError();                                      \
    std::ostringstream os;                                                   \
    os << " (" << x << " vs. " << y << ") ";                                 \
    return LogCheckError(new std::string(os.str()));                         \
  }                                                                          \
  inline LogCheckError LogCheck##name(int x, int y) { return LogCheck##name<int, int>(x, y); }
DMLC_FPT_DEFINE_CHECK_FUNC(_LT, <)
DMLC_FPT_DEFINE_CHECK_FUNC(_GT, >)
DMLC_FPT_DEFINE_CHECK_FUNC(_LE, <=)
DMLC_FPT_DEFINE_CHECK_FUNC(_GE, >=)
DMLC_FPT_DEFINE_CHECK_FUNC(_EQ, ==)
DMLC_FPT_DEFINE_CHECK_FUNC(_NE, !=)
#undef DMLC_FPT_DEFINE_CHECK_FUNC
#pragma GCC diagnostic pop

template <typename T>
inline T CheckNotNull(const char* file, int line, const char* names, T t) {
  if (t == nullptr) {
    LogMessageFatal(file, line).stream() << names;
  }
  return t;
}

}  // namespace dmlc

#define LOG_INFO ::dmlc::LogMessage(__FILE__, __LINE__)
#define LOG_WARNING ::dmlc::LogMessage(__FILE__, __LINE__)
#define LOG_ERROR ::dmlc::LogMessage(__FILE__, __LINE__)
#define LOG_FATAL ::dmlc::LogMessageFatal(__FILE__, __LINE__)
#define LOG_QFATAL LOG_FATAL
#define LOG_DFATAL LOG_FATAL

#define LOG(severity) LOG_##severity.stream()
#define LG LOG_INFO.stream()
#define LOG_IF(severity, condition) \
  !(condition) ? (void)0 : ::dmlc::LogMessageVoidify() & LOG(severity)

#define CHECK(x) LOG_IF(FATAL, !(x)) << "Check failed: " #x << ": "

/* "while" rather than "if": no dangling else, and the body never returns. */
#define CHECK_BINARY_OP(name, op, x, y)                              \
  while (::dmlc::LogCheckError _dmlc_check_err = ::dmlc::LogCheck##name(x, y)) \
  ::dmlc::LogMessageFatal(__FILE__, __LINE__).stream()               \
      << "Check failed: " << #x " " #op " " #y << *_dmlc_check_err << ": "

#define CHECK_LT(x, y) CHECK_BINARY_OP(_LT, <, x, y)
#define CHECK_GT(x, y) CHECK_BINARY_OP(_GT, >, x, y)
#define CHECK_LE(x, y) CHECK_BINARY_OP(_LE, <=, x, y)
#define CHECK_GE(x, y) CHECK_BINARY_OP(_GE, >=, x, y)
#define CHECK_EQ(x, y) CHECK_BINARY_OP(_EQ, ==, x, y)
#define CHECK_NE(x, y) CHECK_BINARY_OP(_NE, !=, x, y)
#define CHECK_NOTNULL(x) ::dmlc::CheckNotNull(__FILE__, __LINE__, "'" #x "' Must be non NULL", (x))

#ifdef NDEBUG
#define DCHECK(x) while (false) CHECK(x)
#define DCHECK_LT(x, y) while (false) CHECK((x) < (y))
#define DCHECK_GT(x, y) while (false) CHECK((x) > (y))
#define DCHECK_LE(x, y) while (false) CHECK((x) <= (y))
#define DCHECK_GE(x, y) while (false) CHECK((x) >= (y))
#define DCHECK_EQ(x, y) while (false) CHECK((x) == (y))
#define DCHECK_NE(x, y) while (false) CHECK((x) != (y))
#else
#define DCHECK(x) CHECK(x)
#define DCHECK_LT(x, y) CHECK_LT(x, y)
#define DCHECK_GT(x, y) CHECK_GT(x, y)
#define DCHECK_LE(x, y) CHECK_LE(x, y)
#define DCHECK_GE(x, y) CHECK_GE(x, y)
#define DCHECK_EQ(x, y) CHECK_EQ(x, y)
#define DCHECK_NE(x, y) CHECK_NE(x, y)
#endif

#endif  // DMLC_LOGGING_H_
