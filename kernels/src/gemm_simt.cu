// Placeholder: filled in by the gemm_simt ladder.
