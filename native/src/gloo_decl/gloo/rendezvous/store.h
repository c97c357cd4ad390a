// Stand-in for gloo/rendezvous/store.h: see plexus_gloo_decl.h.
#pragma once
#include "gloo/plexus_gloo_decl.h"
