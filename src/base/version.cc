#include "base/version.h"

#ifndef NIBBLE_VERSION
#define NIBBLE_VERSION "unknown"
#endif

namespace nibble {

const char* NibbleVersion() { return NIBBLE_VERSION; }

}  // namespace nibble
