"""What a worker carries across steps: error feedback (:mod:`.feedback`), DGC's local momentum as a memory
(:mod:`.velocity`), the send step that applies them around a compressor, written once (:mod:`.send`), and the
momentum schemes built on it, DGC's over P workers and GMC's (:mod:`.momentum`)."""
