// Benchmarks of the gemv ladder.
#include "kernels/bench/harness.h"
