// Benchmarks of the gemm_tc ladder.
#include "kernels/bench/harness.h"
