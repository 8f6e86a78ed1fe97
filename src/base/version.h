// The release of the library (CMake's project version), as written into exported model cards.
#pragma once

namespace nibble {

const char* NibbleVersion();

}  // namespace nibble
