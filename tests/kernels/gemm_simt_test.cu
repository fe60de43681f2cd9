// Tests of the gemm_simt ladder.
#include "tests/kernels/gpu_test_util.h"
