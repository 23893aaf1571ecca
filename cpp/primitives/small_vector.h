// ftjit: a vector that keeps its first N elements inline, so the call path of
// a jitted function allocates nothing for small signatures.
//
// A plain value type: no shared state, takes no locks; its owner guards it.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace ftjit {

template <class T, size_t N>
class SmallVector {
  static_assert(N > 0, "inline capacity must be positive");
  static_assert(std::is_nothrow_move_constructible<T>::value,
                "SmallVector needs nothrow-movable elements");

 public:
  SmallVector() noexcept = default;
  SmallVector(const SmallVector& other) { *this = other; }
  SmallVector(SmallVector&& other) noexcept { *this = std::move(other); }
  ~SmallVector() { reset(); }

  SmallVector& operator=(const SmallVector& other) {
    if (this == &other) return *this;
    clear();
    reserve(other.size_);
    for (size_t i = 0; i < other.size_; ++i) new (data_ + i) T(other.data_[i]);
    size_ = other.size_;
    return *this;
  }

  SmallVector& operator=(SmallVector&& other) noexcept {
    if (this == &other) return *this;
    reset();
    if (other.data_ != other.inline_ptr()) {
      data_ = other.data_;
      cap_ = other.cap_;
      size_ = other.size_;
      other.data_ = other.inline_ptr();
      other.cap_ = N;
      other.size_ = 0;
    } else {
      for (size_t i = 0; i < other.size_; ++i) {
        new (data_ + i) T(std::move(other.data_[i]));
        other.data_[i].~T();
      }
      size_ = other.size_;
      other.size_ = 0;
    }
    return *this;
  }

  size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  T* data() noexcept { return data_; }
  const T* data() const noexcept { return data_; }
  T& operator[](size_t i) noexcept { return data_[i]; }
  const T& operator[](size_t i) const noexcept { return data_[i]; }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }
  T& back() noexcept { return data_[size_ - 1]; }

  void reserve(size_t cap) {
    if (cap <= cap_) return;
    T* fresh = static_cast<T*>(::operator new(cap * sizeof(T)));
    for (size_t i = 0; i < size_; ++i) {
      new (fresh + i) T(std::move(data_[i]));
      data_[i].~T();
    }
    if (data_ != inline_ptr()) ::operator delete(data_);
    data_ = fresh;
    cap_ = cap;
  }

  template <class... Args>
  T& emplace_back(Args&&... args) {
    if (size_ == cap_) reserve(cap_ * 2);
    T* p = new (data_ + size_) T(std::forward<Args>(args)...);
    ++size_;
    return *p;
  }
  void push_back(const T& v) { emplace_back(v); }
  void push_back(T&& v) { emplace_back(std::move(v)); }
  void pop_back() noexcept { data_[--size_].~T(); }

  void clear() noexcept {
    for (size_t i = 0; i < size_; ++i) data_[i].~T();
    size_ = 0;
  }

  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    if (a.size_ != b.size_) return false;
    for (size_t i = 0; i < a.size_; ++i) {
      if (!(a.data_[i] == b.data_[i])) return false;
    }
    return true;
  }

 private:
  T* inline_ptr() noexcept { return reinterpret_cast<T*>(inline_); }
  void reset() noexcept {
    clear();
    if (data_ != inline_ptr()) ::operator delete(data_);
    data_ = inline_ptr();
    cap_ = N;
  }

  alignas(T) unsigned char inline_[N * sizeof(T)];
  T* data_ = inline_ptr();
  size_t size_ = 0;
  size_t cap_ = N;
};

}  // namespace ftjit
