// Tests of the reduce ladder.
#include "tests/kernels/gpu_test_util.h"
