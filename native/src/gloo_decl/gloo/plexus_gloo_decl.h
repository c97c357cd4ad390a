// Declarations of the four gloo types that torch/csrc/distributed/c10d/ProcessGroupGloo.hpp names.
//
// Why this exists: PyTorch wheels ship ProcessGroupGloo.hpp but not the gloo headers it includes
// (torch/include has no gloo/), so the header cannot be compiled as is. Every gloo type in the
// *layout* of c10d::ProcessGroupGloo and its Options is held through std::shared_ptr / unique_ptr,
// so declarations suffice for sizeof(ProcessGroupGloo) and the Options fields to match libtorch's.
// Two gloo classes must be complete for the header to parse, and only with the members its inline
// code names: gloo::rendezvous::Store, the base of the inline c10d::ProcessGroupGloo::GlooStore
// (the members GlooStore overrides, without GLOO_STORE_HAS_STORE_V2 so the optional
// multi_get/multi_set/append/add overrides stay out), and gloo::Context, whose setTimeout the
// inline ProcessGroupGloo::setTimeout calls. These are not gloo's real definitions: plexus never
// constructs a GlooStore or a Context, never calls ProcessGroupGloo::setTimeout (the vtable, and so
// every virtual, comes from libtorch, whose key function ~ProcessGroupGloo is out of line), and
// never touches a gloo object; libtorch does all of that with its own gloo.
//
// Rule for plexus_native.cpp: use ProcessGroupGloo only through its exported constructor, its
// static device factories, Options' fields and the c10d::Backend virtual interface.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
namespace transport {
class Device;
class UnboundBuffer;
} // namespace transport
namespace rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
} // namespace rendezvous
} // namespace gloo
