"""Upstream sources: the lock that pins them, downloads and archives taken safely, the verified cache, and what the
images take from them."""
