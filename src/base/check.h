// Internal contract checks: a broken precondition inside nibble (not bad input) aborts with
// file:line and the failed condition. Input errors use Result/Status (result.h) instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define NIBBLE_CHECK(cond)                                                              \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "nibble: internal check failed at %s:%d: %s\n", __FILE__,     \
                   __LINE__, #cond);                                                    \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

#define NIBBLE_CHECK_MSG(cond, ...)                                                     \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "nibble: internal check failed at %s:%d: %s: ", __FILE__,     \
                   __LINE__, #cond);                                                    \
      std::fprintf(stderr, __VA_ARGS__);                                                \
      std::fputc('\n', stderr);                                                         \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
