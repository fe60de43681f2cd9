// Placeholder: filled in by the gemv ladder.
