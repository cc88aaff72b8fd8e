"""Hot loops shared by the schemes: selection and compaction, stage statistics, counter-hash dithering,
Hadamard mixing, each with an eager torch reference and its accelerated forms."""
