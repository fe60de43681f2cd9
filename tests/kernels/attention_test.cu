// Tests of the attention ladder.
#include "tests/kernels/gpu_test_util.h"
