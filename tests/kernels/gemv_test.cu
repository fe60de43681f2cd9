// Tests of the gemv ladder.
#include "tests/kernels/gpu_test_util.h"
