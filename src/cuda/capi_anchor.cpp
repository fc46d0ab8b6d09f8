// libflashattn_capi.so is the static library linked whole; a shared library needs at least one source.
#include "flashattn/flashattn.h"
