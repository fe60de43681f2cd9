// Placeholder: filled in by the attention ladder.
