// Benchmarks of the reduce ladder.
#include "kernels/bench/harness.h"
