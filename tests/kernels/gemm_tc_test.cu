// Tests of the gemm_tc ladder.
#include "tests/kernels/gpu_test_util.h"
