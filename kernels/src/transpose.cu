// Placeholder: filled in by the transpose ladder.
