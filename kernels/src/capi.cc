// C entry points of the kernels library.
