// plexus' own operators in libtorch's RecordFunction records (the operator counter, the profiler):
// RECORD_FUNCTION(name, inputs) opens one in a scope; PLEXUS_RECORD_OUTPUTS(…) then gives it its
// outputs, for the callbacks that ask for them (the counter's bytes written: plexus_native.cpp,
// part 3). Tensors only need their sizes then: outputs allocated before the kernel fills them are
// fine.
#pragma once

#include <ATen/record_function.h>

#define PLEXUS_RECORD_OUTPUTS(...) \
  if (guard.needsOutputs()) guard.setOutputs(std::vector<c10::IValue>{__VA_ARGS__})
