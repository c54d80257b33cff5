"""winpos: position encodings that work with window attention."""
