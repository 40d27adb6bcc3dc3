"""Page extraction: decoding, challenge detection, main content, markdown, and the worker pool."""
