// Benchmarks of the transpose ladder.
#include "kernels/bench/harness.h"
