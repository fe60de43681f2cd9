// Placeholder: filled in by the reduce ladder.
