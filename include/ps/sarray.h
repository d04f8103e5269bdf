/*
 * ps/sarray.h - ps::SArray<V>, ps-lite's shared array: a pointer, a size
 * and a capacity, the memory held by a std::shared_ptr so that copies and
 * segments share it (a copy of an SArray is cheap and aliases the data).
 * Constructing from a std::vector copies the vector's data.
 */
#ifndef PS_SARRAY_H_
#define PS_SARRAY_H_

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "ps/internal/utils.h"
#include "ps/range.h"

namespace ps {

template <typename V>
class SArray {
 public:
  SArray() {}
  ~SArray() {}

  /* size elements of value val. */
  explicit SArray(size_t size, V val = V()) { resize(size, val); }

  /* A view of arr's memory as V (zero copy); arr's byte size must be a
   * whole number of V. */
  template <typename W>
  explicit SArray(const SArray<W>& arr) {
    *this = arr;
  }
  template <typename W>
  void operator=(const SArray<W>& arr) {
    size_ = arr.size() * sizeof(W) / sizeof(V);
    CHECK_EQ(size_ * sizeof(V), arr.size() * sizeof(W)) << "SArray: cannot view the bytes as whole elements";
    capacity_ = arr.capacity() * sizeof(W) / sizeof(V);
    ptr_ = std::shared_ptr<V>(arr.ptr(), reinterpret_cast<V*>(arr.data()));
  }

  /* Wraps data (zero copy); delete[]s it when the last copy goes if
   * deletable. */
  SArray(V* data, size_t size, bool deletable = false) {
    if (deletable) {
      reset(data, size, [](V* p) { delete[] p; });
    } else {
      reset(data, size, [](V*) {});
    }
  }

  /* Copies of data. */
  explicit SArray(const std::vector<V>& vec) { CopyFrom(vec.data(), vec.size()); }

  /* Shares the vector's memory (zero copy). */
  explicit SArray(const std::shared_ptr<std::vector<V>>& vec) {
    ptr_ = std::shared_ptr<V>(vec, vec->data());
    size_ = vec->size();
    capacity_ = size_;
  }

  template <typename W>
  SArray(const std::initializer_list<W>& list) {
    CopyFrom(list.begin(), list.end());
  }
  template <typename W>
  void operator=(const std::initializer_list<W>& list) {
    CopyFrom(list.begin(), list.end());
  }

  /* Replaces the contents with a copy of data[0..size). */
  void CopyFrom(const V* data, size_t size) {
    V* p = Allocate(size);
    if (size) std::memcpy(p, data, size * sizeof(V));
    reset(p, size, [](V* q) { delete[] q; });
  }
  void CopyFrom(const SArray<V>& other) {
    if (this == &other) return;
    CopyFrom(other.data(), other.size());
  }
  template <typename ForwardIt>
  void CopyFrom(const ForwardIt& first, const ForwardIt& last) {
    size_t size = static_cast<size_t>(std::distance(first, last));
    V* p = Allocate(size);
    std::copy(first, last, p);
    reset(p, size, [](V* q) { delete[] q; });
  }

  /* Holds data with deleter del. */
  template <typename Deleter>
  void reset(V* data, size_t size, Deleter del) {
    size_ = size;
    capacity_ = size;
    ptr_.reset(data, del);
  }

  /* Resizes, keeping the first min(size, size()) elements; new elements
   * are val. Grows into new memory when the capacity is too small (then
   * the array no longer aliases its former copies). */
  void resize(size_t size, V val = V()) {
    size_t cur = size_;
    if (capacity_ >= size) {
      size_ = size;
    } else {
      V* p = Allocate(size + 5);
      if (cur) std::memcpy(p, data(), cur * sizeof(V));
      reset(p, size, [](V* q) { delete[] q; });
      capacity_ = size + 5;
    }
    if (size > cur) std::fill(data() + cur, data() + size, val);
  }

  /* Resizes as resize does but leaves new elements unset (whatever the
   * memory held): for an array the caller overwrites whole at once, which
   * resize would first fill. fpt's addition. */
  void resize_uninitialized(size_t size) {
    if (capacity_ >= size) {
      size_ = size;
      return;
    }
    V* p = Allocate(size);
    if (size_) std::memcpy(p, data(), size_ * sizeof(V));
    reset(p, size, [](V* q) { delete[] q; });
  }
  void reserve(size_t size) {
    if (capacity_ >= size) return;
    size_t old = size_;
    resize(size);
    size_ = old;
  }

  void clear() { reset(nullptr, 0, [](V*) {}); }

  bool empty() const { return size() == 0; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }

  V* begin() { return data(); }
  const V* begin() const { return data(); }
  V* end() { return data() + size(); }
  const V* end() const { return data() + size(); }
  V* data() const { return ptr_.get(); }

  std::shared_ptr<V>& ptr() { return ptr_; }
  const std::shared_ptr<V>& ptr() const { return ptr_; }

  V back() const {
    CHECK(!empty()) << "SArray::back of an empty array";
    return data()[size_ - 1];
  }
  V front() const {
    CHECK(!empty()) << "SArray::front of an empty array";
    return data()[0];
  }
  V& operator[](size_t i) { return data()[i]; }
  const V& operator[](size_t i) const { return data()[i]; }

  void push_back(const V& val) {
    if (size_ == capacity_) reserve(size_ * 2 + 5);
    data()[size_++] = val;
  }
  void pop_back() {
    if (size_) --size_;
  }
  void append(const SArray<V>& arr) {
    if (arr.empty()) return;
    size_t orig = size_;
    resize(size_ + arr.size());
    std::memcpy(data() + orig, arr.data(), arr.size() * sizeof(V));
  }

  /* Elements [begin, end) as an array sharing this one's memory. */
  SArray<V> segment(size_t begin, size_t end) const {
    CHECK_GE(end, begin) << "SArray::segment";
    CHECK_LE(end, size()) << "SArray::segment";
    SArray<V> ret;
    ret.ptr_ = std::shared_ptr<V>(ptr_, data() + begin);
    ret.size_ = end - begin;
    ret.capacity_ = end - begin;
    return ret;
  }

 private:
  static V* Allocate(size_t n) { return n ? new V[n] : nullptr; }

  size_t size_ = 0;
  size_t capacity_ = 0;
  std::shared_ptr<V> ptr_;
};

/* The positions [lb, ub) of the sorted arr's elements in [lower, upper). */
template <typename V>
Range FindRange(const SArray<V>& arr, V lower, V upper) {
  if (upper <= lower) return Range(0, 0);
  auto lb = std::lower_bound(arr.begin(), arr.end(), lower);
  auto ub = std::lower_bound(arr.begin(), arr.end(), upper);
  return Range(lb - arr.begin(), ub - arr.begin());
}

/* "[n]: a b c ... x y z". */
template <typename V>
inline std::string DebugStr(const V* data, int n, int m = 5) {
  std::stringstream ss;
  ss << "[" << n << "]: ";
  if (n < 2 * m) {
    for (int i = 0; i < n; ++i) ss << data[i] << " ";
  } else {
    for (int i = 0; i < m; ++i) ss << data[i] << " ";
    ss << "... ";
    for (int i = n - m; i < n; ++i) ss << data[i] << " ";
  }
  return ss.str();
}

template <typename V>
std::ostream& operator<<(std::ostream& os, const SArray<V>& obj) {
  os << DebugStr(obj.data(), static_cast<int>(obj.size()));
  return os;
}

}  // namespace ps
#endif  // PS_SARRAY_H_
