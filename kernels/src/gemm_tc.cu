// Placeholder: filled in by the gemm_tc ladder.
