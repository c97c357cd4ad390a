// Stand-in for gloo/common/error.h: see plexus_gloo_decl.h.
#pragma once
#include "gloo/plexus_gloo_decl.h"
