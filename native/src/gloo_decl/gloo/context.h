// Stand-in for gloo/context.h: see plexus_gloo_decl.h.
#pragma once
#include "gloo/plexus_gloo_decl.h"
