// The error convention of every C entry point of plexus' native layer (see plexus_native.cpp):
// a call runs under `guarded`, which turns any C++ exception into a malloc'd error string (NULL on
// success) that Rust frees with plexus_free_string, so no exception unwinds into Rust.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace plexus_native {

inline char* dup_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p != nullptr) {
    std::memcpy(p, s.c_str(), s.size() + 1);
  }
  return p;
}

// Runs `f`, turning any exception into an error string. c10::Error's what() carries a C++
// backtrace of libtorch frames; the message without it is what a Rust caller wants to read.
template <typename F>
inline char* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const c10::Error& e) {
    return dup_string(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return dup_string(e.what());
  } catch (...) {
    return dup_string("unknown C++ exception");
  }
}

}  // namespace plexus_native
