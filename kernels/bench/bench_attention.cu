// Benchmarks of the attention ladder.
#include "kernels/bench/harness.h"
