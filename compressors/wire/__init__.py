"""The wire format: a payload's tensors and scalars at their declared widths (:mod:`.payload`) and the bit
packing that serialises them to one flat uint8 tensor (:mod:`.bitpack`)."""
