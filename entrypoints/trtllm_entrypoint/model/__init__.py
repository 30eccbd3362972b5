"""The model: where it comes from (a local directory or the Hub), its files, digest and support."""
