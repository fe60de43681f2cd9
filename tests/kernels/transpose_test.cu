// Tests of the transpose ladder.
#include "tests/kernels/gpu_test_util.h"
