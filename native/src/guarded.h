// The error convention of every C entry point of plexus' native layer (see plexus_native.cpp):
// a call runs under `guarded`, which turns any C++ exception into a malloc'd error block (NULL on
// success) — its kind in the first byte, then the NUL-terminated message — that Rust reads as a
// typed error (native/src/lib.rs, `NativeError`) and frees with plexus_free_string, so no
// exception unwinds into Rust and no kind is told apart by its text.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

namespace plexus_native {

inline char* dup_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p != nullptr) {
    std::memcpy(p, s.c_str(), s.size() + 1);
  }
  return p;
}

// What kind of failure an entry point reports: the first byte of its error block (on the Rust
// side, lib.rs' `check` makes each kind its `NativeError` variant of the same name).
enum class ErrorKind : unsigned char {
  Failed = 1,                // anything else: a libtorch error, a bad argument, a failed launch
  KernelsUnavailable = 2,    // plexus' CUDA kernels cannot run here (no NVRTC or driver, a failed check)
  UnavailableInCapture = 3,  // their first use would fall inside a CUDA graph capture (this call only)
};

// An exception whose kind crosses the boundary; every other exception is ErrorKind::Failed.
struct KindedError : std::runtime_error {
  ErrorKind kind;
  KindedError(ErrorKind k, const std::string& what) : std::runtime_error(what), kind(k) {}
};

// An error block: the kind's byte, then the message and its NUL, in one malloc'd block.
inline char* dup_error(ErrorKind kind, const std::string& message) {
  char* p = static_cast<char*>(std::malloc(message.size() + 2));
  if (p != nullptr) {
    p[0] = static_cast<char>(kind);
    std::memcpy(p + 1, message.c_str(), message.size() + 1);
  }
  return p;
}

// Runs `f`, turning any exception into an error block. c10::Error's what() carries a C++
// backtrace of libtorch frames; the message without it is what a Rust caller wants to read.
template <typename F>
inline char* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const KindedError& e) {
    return dup_error(e.kind, e.what());
  } catch (const c10::Error& e) {
    return dup_error(ErrorKind::Failed, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return dup_error(ErrorKind::Failed, e.what());
  } catch (...) {
    return dup_error(ErrorKind::Failed, "unknown C++ exception");
  }
}

}  // namespace plexus_native
