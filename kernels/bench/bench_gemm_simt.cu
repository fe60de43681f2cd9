// Benchmarks of the gemm_simt ladder.
#include "kernels/bench/harness.h"
