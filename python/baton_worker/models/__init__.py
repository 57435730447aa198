"""Graph models that ship with Baton (each a package with its builder)."""
