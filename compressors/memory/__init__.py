"""What a worker carries across steps: error feedback (:mod:`.feedback`), DGC's and GMC's momentum
(:mod:`.momentum`), and the send step that applies them around a compressor (:mod:`.send`)."""
