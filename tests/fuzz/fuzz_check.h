// What the fuzz targets assert beyond "no crash": a property that does not
// hold aborts, which libFuzzer reports as a crash with its input.
#ifndef GPUCOMPUTE_TESTS_FUZZ_FUZZ_CHECK_H_
#define GPUCOMPUTE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

// Aborts, naming the condition and where it failed, unless `condition` holds.
#define FUZZ_CHECK(condition)                                                                 \
  do {                                                                                        \
    if (!(condition)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                           \
    }                                                                                         \
  } while (0)

#endif  // GPUCOMPUTE_TESTS_FUZZ_FUZZ_CHECK_H_
