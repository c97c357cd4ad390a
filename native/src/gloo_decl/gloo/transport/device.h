// Stand-in for gloo/transport/device.h: see plexus_gloo_decl.h.
#pragma once
#include "gloo/plexus_gloo_decl.h"
